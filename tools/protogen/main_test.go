package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReproducesUpstream generates upstream's pgalloc.proto (as recovered in
// testdata) and compares the result with the generated file in the pinned
// upstream module: the generator is pinned right if they are equal but for
// the protoc line of the header (protogen runs no protoc).
func TestReproducesUpstream(t *testing.T) {
	pin, err := os.ReadFile("../PIN")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "mod", "download", "-json", "gvisor.dev/gvisor@"+strings.TrimSpace(string(pin))).Output()
	if err != nil {
		t.Fatalf("go mod download of the pinned upstream module: %v", err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download printed %q: %v", out, err)
	}
	const importPath = "gvisor.dev/gvisor/pkg/sentry/pgalloc/pgalloc_metadata_go_proto"
	name, got, err := generate("testdata/upstream", "pkg/sentry/pgalloc/pgalloc.proto", importPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := importPath + "/pgalloc.pb.go"; name != want {
		t.Fatalf("generated %s, want %s", name, want)
	}
	want, err := os.ReadFile(filepath.Join(mod.Dir, "pkg/sentry/pgalloc/pgalloc_metadata_go_proto/pgalloc.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := withoutProtocLine(t, got), withoutProtocLine(t, want); !bytes.Equal(got, want) {
		t.Errorf("generated code differs from upstream's:\n%s\nwant:\n%s", got, want)
	}
}

// withoutProtocLine returns b without its header's protoc version line.
func withoutProtocLine(t *testing.T, b []byte) []byte {
	lines := bytes.SplitAfter(b, []byte("\n"))
	for i, l := range lines {
		if bytes.HasPrefix(l, []byte("// \tprotoc ")) {
			return bytes.Join(append(lines[:i:i], lines[i+1:]...), nil)
		}
	}
	t.Fatalf("no protoc line in the header of:\n%s", b)
	return nil
}
