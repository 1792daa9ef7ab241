module github.com/forkvisor/forkvisor/tools/protogen

go 1.26.3

require (
	github.com/bufbuild/protocompile v0.14.1
	google.golang.org/protobuf v1.36.11
)

require golang.org/x/sync v0.8.0 // indirect
