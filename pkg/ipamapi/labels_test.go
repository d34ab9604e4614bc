package ipamapi

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"testing"
)

// Classes and Operations, which the alert rules' label values are checked against
// (test/observability), list every constant of their type in this package's source: a
// class added without them would be an outcome the metrics emit and the check never saw.
func TestClassesAndOperationsListEveryConstant(t *testing.T) {
	declared := constantsOfType(t, "Class", "Operation")
	var classes, ops []string
	for _, c := range Classes {
		classes = append(classes, string(c))
	}
	for _, o := range Operations {
		ops = append(ops, string(o))
	}
	for typ, listed := range map[string][]string{"Class": classes, "Operation": ops} {
		slices.Sort(listed)
		slices.Sort(declared[typ])
		if !slices.Equal(listed, declared[typ]) {
			t.Errorf("the constants of type %s are %v; the list has %v", typ, declared[typ], listed)
		}
	}
	outcomes := Outcomes()
	if len(outcomes) != len(Classes)+1 || !slices.Contains(outcomes, "success") || !slices.Contains(outcomes, "wrong_secret") {
		t.Errorf("Outcomes() = %v", outcomes)
	}
}

// constantsOfType returns the values of the string constants of each named type
// declared in this package's non-test files.
func constantsOfType(t *testing.T, types ...string) map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", nil, 0) //nolint:staticcheck // one package, no build tags
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for name, f := range pkgs["ipamapi"].Files {
		if len(name) > 8 && name[len(name)-8:] == "_test.go" {
			continue
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				id, ok := vs.Type.(*ast.Ident)
				if !ok || !slices.Contains(types, id.Name) {
					continue
				}
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						out[id.Name] = append(out[id.Name], lit.Value[1:len(lit.Value)-1])
					}
				}
			}
		}
	}
	if len(out) != len(types) {
		t.Fatalf("found constants of %d of the types %v", len(out), types)
	}
	return out
}
