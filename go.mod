module github.com/forkvisor/forkvisor

go 1.26.3

require (
	golang.org/x/sys v0.48.0
	google.golang.org/grpc v1.85.0
	gvisor.dev/gvisor v0.0.0-20260905035102-160fafc42237
	k8s.io/cri-api v0.37.2
)

require (
	golang.org/x/exp v0.0.0-20250711185948-6ae5c78190dc // indirect
	golang.org/x/mod v0.41.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.15.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
