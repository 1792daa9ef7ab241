package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
)

// template is the part of an upstream filter_precompiled.go that generate
// rewrites.
const template = `package filter

import "gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"

var precompiledPrograms map[string]precompiledseccomp.Program

const PrecompilationDisabledAtBuildTime = true

func registerPrograms() {
` + emptyBody + `	precompiledPrograms = programs
}
`

// parsed is what a generated file says about its programs.
type parsed struct {
	enabled  bool
	arrays   map[string][]uint32         // package-level bytecode arrays
	bytecode map[string]string           // program name -> array it points at
	offsets  map[string]map[string][]int // program name -> VarOffsets
	literals int                         // []uint32 literals in registerPrograms
}

func parseGenerated(t *testing.T, src string) parsed {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "gen.go", src, 0)
	if err != nil {
		t.Fatalf("generated file does not parse: %v\n%s", err, src)
	}
	p := parsed{arrays: map[string][]uint32{}, bytecode: map[string]string{}, offsets: map[string]map[string][]int{}}
	unquote := func(e ast.Expr) string {
		s, err := strconv.Unquote(e.(*ast.BasicLit).Value)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ints := func(e ast.Expr) []int {
		var out []int
		if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
			return nil
		}
		for _, el := range e.(*ast.CompositeLit).Elts {
			v, err := strconv.ParseInt(el.(*ast.BasicLit).Value, 0, 64)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, int(v))
		}
		return out
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.GenDecl:
			for _, s := range d.Specs {
				vs, ok := s.(*ast.ValueSpec)
				if !ok || len(vs.Values) != 1 {
					continue
				}
				if d.Tok == token.CONST && vs.Names[0].Name == "PrecompilationDisabledAtBuildTime" {
					p.enabled = vs.Values[0].(*ast.Ident).Name == "false"
				}
				if lit, ok := vs.Values[0].(*ast.CompositeLit); ok && strings.HasPrefix(vs.Names[0].Name, "precompiledBytecode") {
					var words []uint32
					for _, v := range ints(lit) {
						words = append(words, uint32(v))
					}
					p.arrays[vs.Names[0].Name] = words
				}
			}
		case *ast.FuncDecl:
			if d.Name.Name != "registerPrograms" {
				continue
			}
			ast.Inspect(d.Body, func(n ast.Node) bool {
				if lit, ok := n.(*ast.CompositeLit); ok {
					if at, ok := lit.Type.(*ast.ArrayType); ok && at.Len == nil {
						if id, ok := at.Elt.(*ast.Ident); ok && id.Name == "uint32" {
							p.literals++
						}
					}
				}
				as, ok := n.(*ast.AssignStmt)
				if !ok {
					return true
				}
				idx, ok := as.Lhs[0].(*ast.IndexExpr)
				if !ok {
					return true
				}
				name := unquote(idx.Index)
				for _, el := range as.Rhs[0].(*ast.CompositeLit).Elts {
					kv := el.(*ast.KeyValueExpr)
					switch kv.Key.(*ast.Ident).Name {
					case "Bytecode32":
						if se, ok := kv.Value.(*ast.SliceExpr); ok {
							p.bytecode[name] = se.X.(*ast.Ident).Name
						}
					case "VarOffsets":
						m := map[string][]int{}
						for _, e := range kv.Value.(*ast.CompositeLit).Elts {
							kv := e.(*ast.KeyValueExpr)
							m[unquote(kv.Key)] = ints(kv.Value)
						}
						p.offsets[name] = m
					}
				}
				return true
			})
		}
	}
	return p
}

func TestGenerate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		programs []precompiledseccomp.Program
	}{
		{name: "none"},
		{
			name: "with and without variables",
			programs: []precompiledseccomp.Program{
				// Out of order: the file lists them sorted.
				{Name: `Platform="systrap" SharedBase=true`, Bytecode32: []uint32{0x20, 0x4, 0xc000003e, 0x15, 1, 2, 3, 4, 5, 6, 7, 0xffffffff}, VarOffsets: map[string][]int{"fd_hi": {3}, "fd_lo": {5, 9}, "unused": nil}},
				{Name: `Platform="kvm"`, Bytecode32: []uint32{0x6, 0x7fff0000}, VarOffsets: map[string][]int{}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gen, err := generate(template, "PrecompilationDisabledAtBuildTime", tc.programs)
			if err != nil {
				t.Fatalf("generate: %v", err)
			}
			p := parseGenerated(t, gen)
			if !p.enabled {
				t.Errorf("PrecompilationDisabledAtBuildTime is not false in:\n%s", gen)
			}
			if p.literals != 0 {
				t.Errorf("registerPrograms builds %d []uint32 literals at run time; want them in package-level arrays:\n%s", p.literals, gen)
			}
			if len(p.bytecode) != len(tc.programs) || len(p.arrays) != len(tc.programs) {
				t.Errorf("got %d registrations and %d arrays, want %d of each:\n%s", len(p.bytecode), len(p.arrays), len(tc.programs), gen)
			}
			for _, want := range tc.programs {
				array, ok := p.bytecode[want.Name]
				if !ok {
					t.Errorf("program %q is not registered", want.Name)
					continue
				}
				if got := p.arrays[array]; !reflect.DeepEqual(got, want.Bytecode32) {
					t.Errorf("program %q: bytecode %#x, want %#x", want.Name, got, want.Bytecode32)
				}
				wantOffsets := want.VarOffsets
				if wantOffsets == nil {
					wantOffsets = map[string][]int{}
				}
				if got := p.offsets[want.Name]; !reflect.DeepEqual(got, wantOffsets) {
					t.Errorf("program %q: VarOffsets %v, want %v", want.Name, got, wantOffsets)
				}
			}
		})
	}
}

func TestGenerateRefusesUnexpectedTemplates(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"registerPrograms not empty", strings.Replace(template, emptyBody, emptyBody+"\tprograms[\"x\"] = precompiledseccomp.Program{}\n", 1) + "func other() {\n" + emptyBody + "}\n", "does not have the expected empty body"},
		{"no empty body", strings.Replace(template, emptyBody, "", 1), "does not have the expected empty body"},
		{"no disabled constant", strings.Replace(template, "const PrecompilationDisabledAtBuildTime = true\n", "", 1), "PrecompilationDisabledAtBuildTime = true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := generate(tc.src, "PrecompilationDisabledAtBuildTime", nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("generate: got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
