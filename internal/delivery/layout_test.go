package delivery

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/svcrelay/relay/"

// listed is one package as `go list` describes it.
type listed struct {
	Path, Name string
	Imports    []string
	// Kind: its non-test files declare a Kind (var _ Kind
	// = ..., which the compiler checks) or build a Form.
	Kind bool
}

// declaresKind reports whether the files in dir declare a Kind or
// build a Form (listed.Kind).
func declaresKind(t *testing.T, dir string, files []string) bool {
	t.Helper()
	is := func(e ast.Expr, name string) bool {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		x, ok := sel.X.(*ast.Ident)
		return ok && x.Name == "delivery" && sel.Sel.Name == name
	}
	found := false
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				found = found || is(n.Type, "Kind")
			case *ast.CompositeLit:
				found = found || is(n.Type, "Form")
			}
			return !found
		})
	}
	return found
}

// testKit reports whether p is a test kit: a package x/xtest (simtest,
// formstest, forwardtest), compiled into tests only.
func (p listed) testKit() bool {
	return strings.HasSuffix(p.Name, "test") && strings.HasSuffix(p.Path, "/"+p.Name)
}

// layoutProblems is the structure rule over the packages of
// internal/... (with their non-test imports) and the dependencies of the
// relay binary:
//   - no package imports a sibling's subpackage (internal/a importing
//     internal/b/c, b != a), test kits included (the simulator's kit is
//     internal/simtest, not internal/sim/simtest, for that reason);
//   - the relay binary depends on no test kit;
//   - one delivery engine: internal/delivery is the only package named for
//     delivering; every lane kind outside it (groupidentify, usermap:
//     the events kind is its own) imports it, plugs a Kind into it (listed.Kind) and none imports
//     another kind.
func layoutProblems(pkgs, binary []listed) []string {
	var out []string
	top := func(path string) (string, bool) { // "internal/a/b" -> "a", nested
		rest, ok := strings.CutPrefix(path, module+"internal/")
		if !ok {
			return "", false
		}
		first, _, nested := strings.Cut(rest, "/")
		return first, nested
	}
	byPath := map[string]listed{}
	for _, p := range pkgs {
		byPath[p.Path] = p
	}
	for _, p := range pkgs {
		a, _ := top(p.Path)
		for _, imp := range p.Imports {
			b, nested := top(imp)
			if b == "" || b == a || !nested {
				continue
			}
			out = append(out, fmt.Sprintf("%s imports %s, a subpackage of its sibling internal/%s", p.Path, imp, b))
		}
	}
	for _, p := range binary {
		if strings.HasPrefix(p.Path, module) && p.testKit() {
			out = append(out, fmt.Sprintf("the relay binary depends on the test kit %s", p.Path))
		}
	}
	engine := module + "internal/delivery"
	for _, p := range pkgs {
		last := p.Path[strings.LastIndex(p.Path, "/")+1:]
		if p.Path != engine && strings.Contains(last, "deliver") {
			out = append(out, fmt.Sprintf("%s: a second delivery package beside internal/delivery", p.Path))
		}
	}
	kinds := []string{module + "internal/groupidentify", module + "internal/usermap"}
	for _, k := range kinds {
		p, ok := byPath[k]
		if !ok {
			out = append(out, fmt.Sprintf("lane kind %s not listed", k))
			continue
		}
		if !slices.Contains(p.Imports, engine) {
			out = append(out, fmt.Sprintf("lane kind %s does not use internal/delivery", k))
		}
		if !p.Kind {
			out = append(out, fmt.Sprintf("lane kind %s declares no Kind", k))
		}
		for _, other := range kinds {
			for _, imp := range p.Imports {
				if other != k && (imp == other || strings.HasPrefix(imp, other+"/")) {
					out = append(out, fmt.Sprintf("lane kind %s imports the lane kind %s", k, imp))
				}
			}
		}
	}
	return out
}

func goList(t *testing.T, args ...string) []listed {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	args = append([]string{"list", "-f", "{{.ImportPath}}\t{{.Name}}\t{{.Dir}}\t{{join .GoFiles \" \"}}\t{{join .Imports \" \"}}"}, args...)
	out, err := exec.Command(goBin, args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	var pkgs []listed
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(f) == 5 {
			pkgs = append(pkgs, listed{Path: f[0], Name: f[1], Imports: strings.Fields(f[4]),
				Kind: declaresKind(t, f[2], strings.Fields(f[3]))})
		}
	}
	return pkgs
}

// TestLayout checks the layout on the tree as it is:
// `go list ./internal/...` shows one delivery engine and no package that
// imports a sibling's subpackage.
func TestLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	pkgs := goList(t, module+"internal/...")
	binary := goList(t, "-deps", module+"cmd/relay")
	if len(pkgs) < 20 || len(binary) < 20 {
		t.Fatalf("go list found %d packages under internal/, %d in the binary", len(pkgs), len(binary))
	}
	for _, p := range layoutProblems(pkgs, binary) {
		t.Error(p)
	}
}

// The rule finds the layouts it forbids (a kind on another kind's
// subpackage, a test kit in the binary), and passes the layout it asks for.
func TestLayoutProblems(t *testing.T) {
	pkg := func(path string, imports ...string) listed {
		for i := range imports {
			imports[i] = module + imports[i]
		}
		return listed{Path: module + path, Name: path[strings.LastIndex(path, "/")+1:], Imports: imports, Kind: true}
	}
	good := []listed{
		pkg("internal/delivery", "internal/spool"),
		pkg("internal/spool"),
		pkg("internal/groupidentify", "internal/delivery", "internal/forms"),
		pkg("internal/usermap", "internal/delivery", "internal/forms"),
		pkg("internal/forms", "internal/delivery"),
		pkg("internal/sim"),
		pkg("internal/simtest", "internal/sim"),
		pkg("internal/forms/formstest", "internal/forms", "internal/simtest"),
	}
	binary := []listed{pkg("cmd/relay"), pkg("internal/delivery"), pkg("internal/sim")}
	if p := layoutProblems(good, binary); len(p) != 0 {
		t.Fatalf("the asked-for layout has problems: %q", p)
	}
	bad := map[string]listed{}
	for _, p := range good {
		bad[p.Path] = p
	}
	for _, p := range []listed{
		// A kind on another kind's subpackage, a second delivery package.
		pkg("internal/groupidentify/lanedeliver", "internal/delivery", "internal/spool"),
		pkg("internal/usermap", "internal/groupidentify/lanedeliver", "internal/forms"),
		// A product package on a test kit, and a kind on another kind.
		pkg("internal/ingest", "internal/forms/formstest"),
		{Path: module + "internal/groupidentify", Name: "groupidentify", Imports: []string{module + "internal/delivery", module + "internal/usermap"}},
	} {
		bad[p.Path] = p
	}
	got := strings.Join(layoutProblems(slices.Collect(maps.Values(bad)), append(binary, pkg("internal/simtest"))), "\n")
	for _, want := range []string{
		"internal/usermap imports " + module + "internal/groupidentify/lanedeliver, a subpackage of its sibling internal/groupidentify",
		"internal/ingest imports " + module + "internal/forms/formstest, a subpackage of its sibling internal/forms",
		"internal/groupidentify/lanedeliver: a second delivery package",
		"lane kind " + module + "internal/usermap does not use internal/delivery",
		"lane kind " + module + "internal/groupidentify imports the lane kind " + module + "internal/usermap",
		"lane kind " + module + "internal/groupidentify declares no Kind",
		"the relay binary depends on the test kit " + module + "internal/simtest",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("not found: %s\nproblems:\n%s", want, got)
		}
	}
}
