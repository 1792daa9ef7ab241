// Command protogen regenerates the Go code of a .proto file in the
// materialized gVisor tree, for the fork's patches that change one.
//
// gVisor's Go module ships generated .pb.go files without their .proto
// sources or a protoc. The patches that change a message therefore add the
// .proto beside the generated code, and this tool, pinned in its own go.mod
// to the protoc-gen-go release that generated upstream's files (see the
// header of any upstream .pb.go), turns it into Go without protoc:
// protocompile parses and links the .proto, and protoc-gen-go's own
// generator writes the code. `make proto` runs it; `make check-patches`
// runs it with -check, which fails if a committed .pb.go differs from what
// its .proto generates.
//
// Usage:
//
//	protogen [-check] -tree DIR PROTO=GOIMPORTPATH...
//
// PROTO is the .proto file's path relative to DIR (also its name in the
// descriptor); GOIMPORTPATH is the Go package of the generated code, which
// must lie under gvisor.dev/gvisor/.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/bufbuild/protocompile"
	gengo "google.golang.org/protobuf/cmd/protoc-gen-go/internal_gengo"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// treeModule is the module path of the tree's generated packages.
const treeModule = "gvisor.dev/gvisor/"

func main() {
	tree := flag.String("tree", "build/gvisor", "the materialized gVisor tree")
	check := flag.Bool("check", false, "compare the generated code with the tree's instead of writing it")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: protogen [-check] -tree DIR PROTO=GOIMPORTPATH...")
		os.Exit(2)
	}
	failed := false
	for _, arg := range flag.Args() {
		protoPath, importPath, ok := strings.Cut(arg, "=")
		if !ok || !strings.HasPrefix(importPath, treeModule) {
			fmt.Fprintf(os.Stderr, "protogen: %q is not PROTO=%s...\n", arg, treeModule)
			os.Exit(2)
		}
		name, content, err := generate(*tree, protoPath, importPath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "protogen: %v\n", err)
			os.Exit(1)
		}
		dst := filepath.Join(*tree, filepath.FromSlash(strings.TrimPrefix(name, treeModule)))
		if *check {
			have, err := os.ReadFile(dst)
			if err != nil {
				fmt.Fprintf(os.Stderr, "protogen: %v\n", err)
				os.Exit(1)
			}
			if !bytes.Equal(have, content) {
				fmt.Fprintf(os.Stderr, "protogen: %s is not what %s generates (run make proto)\n", dst, protoPath)
				failed = true
				continue
			}
			fmt.Printf("protogen: %s matches %s\n", dst, protoPath)
			continue
		}
		if err := os.WriteFile(dst, content, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "protogen: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("protogen: wrote %s from %s\n", dst, protoPath)
	}
	if failed {
		os.Exit(1)
	}
}

// generate compiles protoPath in tree and returns the generated file's name
// (an import path plus file name) and content.
func generate(tree, protoPath, importPath string) (string, []byte, error) {
	compiler := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{tree}}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	files, err := compiler.Compile(context.Background(), protoPath)
	if err != nil {
		return "", nil, fmt.Errorf("compiling %s: %w", protoPath, err)
	}
	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: []string{protoPath},
		// Upstream's .proto files carry no go_package: Bazel names the
		// package, and so does the command line here.
		Parameter: proto.String("M" + protoPath + "=" + importPath),
		ProtoFile: []*descriptorpb.FileDescriptorProto{protodesc.ToFileDescriptorProto(files[0])},
	}
	plugin, err := protogen.Options{}.New(req)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", protoPath, err)
	}
	for _, f := range plugin.Files {
		if f.Generate {
			gengo.GenerateFile(plugin, f)
		}
	}
	resp := plugin.Response()
	if resp.Error != nil {
		return "", nil, fmt.Errorf("%s: %s", protoPath, resp.GetError())
	}
	if len(resp.File) != 1 {
		return "", nil, fmt.Errorf("%s: generated %d files, want 1", protoPath, len(resp.File))
	}
	name := resp.File[0].GetName()
	if path.Dir(name) != importPath {
		return "", nil, fmt.Errorf("%s: generated %s outside %s", protoPath, name, importPath)
	}
	return name, []byte(resp.File[0].GetContent()), nil
}
