package gamma_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// meshTest is one test of the suite's mesh tests (tests/mesh/*.go), as
// its source states it: the manifests it applies after the base ones, the
// requests it makes and what it expects of each.
type meshTest struct {
	ShortName string
	File      string
	Manifests []string
	Cases     []meshCase
	// Weights is the split a weight test expects, by backend (a prefix of
	// the serving Pod's name): the test sends a batch of requests and
	// compares the share each backend served.
	Weights map[string]float64
}

// meshCase is one http.ExpectedResponse of a test, with the namespace of
// the client that makes the request.
type meshCase struct {
	Name   string
	Client string
	Want   expectation
}

// expectation is what the suite's mesh client (utils/echo/pod.go:
// makeRequest and compareRequest) does with an http.ExpectedResponse: the
// request it makes (Host, Path, Method, Headers, Protocol) and what it
// compares (the status codes, the response headers set and absent, the
// request headers the backend saw and did not see, and the prefix of the
// serving Pod's name). It compares nothing else — not the path the backend
// saw, nor a redirect's location — so neither does this test.
type expectation struct {
	Host, Method, Path, Protocol string
	Headers                      map[string]string
	StatusCodes                  []int
	ResponseHeaders              map[string]string
	ResponseAbsent               []string
	BackendHeaders               map[string]string
	BackendAbsent                []string
	Backend                      string
}

// structLit is a struct composite literal read from the source: its type
// as written and its keyed fields.
type structLit struct {
	Type   string
	Fields map[string]any
}

// podAddress stands for a Pod's address, which a test reads at run time
// (MeshFrontend's request to the Pod rather than to the Service): an
// address from TEST-NET-1 that no Service name is.
const podAddress = "192.0.2.10"

// readMeshTests reads every suite.ConformanceTest of the suite's mesh
// package (tests/mesh/*.go under dir), sorted by ShortName. consts are the
// suite package's string constants by qualified name ("suite.MeshNamespace").
func readMeshTests(dir string, consts map[string]string) ([]meshTest, error) {
	files, err := filepath.Glob(filepath.Join(dir, "tests", "mesh", "*.go"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no Go files in %s: %w", filepath.Join(dir, "tests", "mesh"), err)
	}
	fset := token.NewFileSet()
	byVar := map[string]*meshTest{}
	refs := map[string]string{} // a test whose Test is another's: var → var
	var order []string
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, decl := range file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if len(vs.Names) != 1 || len(vs.Values) != 1 {
					continue
				}
				lit, ok := vs.Values[0].(*ast.CompositeLit)
				if !ok || typeString(lit.Type) != "suite.ConformanceTest" {
					continue
				}
				r := &reader{fset: fset, consts: consts}
				mt, ref, err := r.conformanceTest(lit)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", filepath.Base(f), vs.Names[0].Name, err)
				}
				mt.File = filepath.Base(f)
				byVar[vs.Names[0].Name] = mt
				order = append(order, vs.Names[0].Name)
				if ref != "" {
					refs[vs.Names[0].Name] = ref
				}
			}
		}
	}
	for name, ref := range refs {
		from := byVar[ref]
		if from == nil || refs[ref] != "" {
			return nil, fmt.Errorf("%s runs the Test of %s, which is not a test of the package with its own Test", name, ref)
		}
		byVar[name].Cases, byVar[name].Weights = from.Cases, from.Weights
	}
	out := make([]meshTest, 0, len(order))
	for _, name := range order {
		out = append(out, *byVar[name])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ShortName < out[j].ShortName })
	return out, nil
}

// readSuiteConsts reads the string constants of the suite's utils/suite
// package, such as MeshNamespace, by their qualified names.
func readSuiteConsts(dir string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "utils", "suite", "*.go"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, decl := range file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, v := range vs.Values {
					if bl, ok := v.(*ast.BasicLit); ok && bl.Kind == token.STRING && i < len(vs.Names) {
						s, err := strconv.Unquote(bl.Value)
						if err != nil {
							return nil, err
						}
						out["suite."+vs.Names[i].Name] = s
					}
				}
			}
		}
	}
	for _, want := range []string{"suite.MeshNamespace", "suite.MeshConsumerNamespace"} {
		if out[want] == "" {
			return nil, fmt.Errorf("the suite package defines no constant %s", want)
		}
	}
	return out, nil
}

// reader reads one test's literals. It knows the suite's constants, the
// test function's local definitions, and its clients (echo.ConnectToApp
// and echo.ConnectToAppInNamespace) with their namespaces.
type reader struct {
	fset    *token.FileSet
	consts  map[string]string
	locals  map[string]ast.Expr
	clients map[string]string
	depth   int
}

func (r *reader) pos(n ast.Node) string { return r.fset.Position(n.Pos()).String() }

// conformanceTest reads a suite.ConformanceTest literal; ref names the
// test whose Test function it reuses, if it does.
func (r *reader) conformanceTest(lit *ast.CompositeLit) (mt *meshTest, ref string, err error) {
	mt = &meshTest{}
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			return nil, "", fmt.Errorf("%s: an unkeyed field", r.pos(el))
		}
		key, _ := kv.Key.(*ast.Ident)
		if key == nil {
			return nil, "", fmt.Errorf("%s: a field key that is not a name", r.pos(kv.Key))
		}
		switch key.Name {
		case "ShortName":
			v, err := r.value(kv.Value)
			if err != nil {
				return nil, "", err
			}
			s, ok := v.(string)
			if !ok {
				return nil, "", fmt.Errorf("%s: ShortName is not a string", r.pos(kv.Value))
			}
			mt.ShortName = s
		case "Manifests":
			v, err := r.value(kv.Value)
			if err != nil {
				return nil, "", err
			}
			s, ok := v.([]string)
			if !ok {
				return nil, "", fmt.Errorf("%s: Manifests is not a list of strings", r.pos(kv.Value))
			}
			mt.Manifests = s
		case "Test":
			switch fn := kv.Value.(type) {
			case *ast.FuncLit:
				if err := r.testFunc(mt, fn); err != nil {
					return nil, "", err
				}
			case *ast.SelectorExpr:
				if id, ok := fn.X.(*ast.Ident); ok && fn.Sel.Name == "Test" {
					ref = id.Name
					continue
				}
				return nil, "", fmt.Errorf("%s: Test is %s", r.pos(fn), typeString(fn))
			default:
				return nil, "", fmt.Errorf("%s: Test is neither a function literal nor another test's Test", r.pos(fn))
			}
		}
	}
	if mt.ShortName == "" {
		return nil, "", errors.New("no ShortName")
	}
	return mt, ref, nil
}

// requestMethods are the client methods that make the requests of a case.
var requestMethods = []string{"MakeRequestAndExpectEventuallyConsistentResponse", "RequestBatch"}

// testFunc reads a test function: its clients, its local definitions, its
// http.ExpectedResponse literals (typed, or elements of a
// []http.ExpectedResponse) and the client each goes to, and its expected
// weights (a map[string]float64 literal).
func (r *reader) testFunc(mt *meshTest, fn *ast.FuncLit) error {
	r.locals, r.clients = map[string]ast.Expr{}, map[string]string{}
	requesters := map[string]bool{}
	sliceClient := map[string]string{} // a variable of cases → the client that requests them
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE && len(n.Lhs) == len(n.Rhs) {
				for i, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						r.locals[id.Name] = n.Rhs[i]
					}
				}
			}
		case *ast.CallExpr:
			if c, ok := r.requestCall(n); ok {
				requesters[c] = true
				for _, a := range n.Args {
					if id, ok := a.(*ast.Ident); ok {
						sliceClient[id.Name] = c
					}
				}
			}
		case *ast.RangeStmt:
			if id, ok := n.X.(*ast.Ident); ok {
				ast.Inspect(n.Body, func(m ast.Node) bool {
					if call, ok := m.(*ast.CallExpr); ok {
						if c, ok := r.requestCall(call); ok {
							sliceClient[id.Name] = c
						}
					}
					return true
				})
			}
		}
		return true
	})
	for name, e := range r.locals {
		call, ok := e.(*ast.CallExpr)
		if !ok {
			continue
		}
		switch typeString(call.Fun) {
		case "echo.ConnectToApp":
			r.clients[name] = r.consts["suite.MeshNamespace"]
		case "echo.ConnectToAppInNamespace":
			if len(call.Args) != 4 {
				return fmt.Errorf("%s: ConnectToAppInNamespace with %d arguments", r.pos(call), len(call.Args))
			}
			v, err := r.value(call.Args[3])
			if err != nil {
				return err
			}
			ns, ok := v.(string)
			if !ok {
				return fmt.Errorf("%s: a client's namespace is not a string", r.pos(call.Args[3]))
			}
			r.clients[name] = ns
		}
	}
	var lits []ownedLit
	collectCases(fn.Body, "", r, &lits)
	seen := map[string]int{}
	for i, l := range lits {
		client := ""
		switch {
		case len(requesters) == 1:
			for c := range requesters {
				client = c
			}
		case strings.HasPrefix(l.owner, "call:"):
			client = strings.TrimPrefix(l.owner, "call:")
		default:
			client = sliceClient[l.owner]
		}
		ns, ok := r.clients[client]
		if !ok {
			return fmt.Errorf("%s: cannot tell which client makes this request (%d clients make requests)", r.pos(l.lit), len(requesters))
		}
		v, err := r.value(l.lit)
		if err != nil {
			return err
		}
		want, name, err := expectationOf(v.(structLit))
		if err != nil {
			return fmt.Errorf("%s: %w", r.pos(l.lit), err)
		}
		if name == "" {
			name = caseName(i, want)
		}
		if n := seen[name]; n > 0 {
			name = fmt.Sprintf("%s#%02d", name, n) // as go test names a repeated subtest
		}
		seen[strings.SplitN(name, "#", 2)[0]]++
		mt.Cases = append(mt.Cases, meshCase{Name: name, Client: ns, Want: want})
	}
	var werr error
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if lit, ok := n.(*ast.CompositeLit); ok && typeString(lit.Type) == "map[string]float64" {
			if mt.Weights != nil {
				werr = fmt.Errorf("%s: a second map of weights", r.pos(lit))
			}
			v, err := r.value(lit)
			werr = errors.Join(werr, err)
			mt.Weights, _ = v.(map[string]float64)
		}
		return true
	})
	return werr
}

// caseName names a case as the suite's GetTestCaseName does.
func caseName(i int, e expectation) string {
	s := fmt.Sprintf("%d request to '%s%s'", i, e.Host, e.Path)
	if e.Headers != nil {
		s += " with headers"
	}
	if e.Backend != "" {
		return s + " should go to " + e.Backend
	}
	return fmt.Sprintf("%s should receive one of %v", s, e.StatusCodes)
}

// requestCall reports whether call makes a request of a case, and with
// which client variable.
func (r *reader) requestCall(call *ast.CallExpr) (string, bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || !slices.Contains(requestMethods, sel.Sel.Name) {
		return "", false
	}
	id, ok := sel.X.(*ast.Ident)
	if !ok {
		return "", false
	}
	return id.Name, true
}

// ownedLit is an http.ExpectedResponse literal and what holds it: the
// variable it is assigned or appended to, or "call:<client>" when it is an
// argument of a client's request.
type ownedLit struct {
	lit   *ast.CompositeLit
	owner string
}

// collectCases finds the http.ExpectedResponse literals under n in source
// order, each with its owner.
func collectCases(n ast.Node, owner string, r *reader, out *[]ownedLit) {
	ast.Inspect(n, func(m ast.Node) bool {
		switch m := m.(type) {
		case *ast.AssignStmt:
			if len(m.Lhs) == 1 && len(m.Rhs) == 1 {
				if id, ok := m.Lhs[0].(*ast.Ident); ok {
					collectCases(m.Rhs[0], id.Name, r, out)
					return false
				}
			}
		case *ast.CallExpr:
			if c, ok := r.requestCall(m); ok {
				for _, a := range m.Args {
					collectCases(a, "call:"+c, r, out)
				}
				return false
			}
		case *ast.CompositeLit:
			switch typeString(m.Type) {
			case "http.ExpectedResponse":
				*out = append(*out, ownedLit{m, owner})
				return false
			case "[]http.ExpectedResponse":
				for _, el := range m.Elts {
					if lit, ok := el.(*ast.CompositeLit); ok {
						if lit.Type == nil {
							lit = &ast.CompositeLit{Type: &ast.SelectorExpr{X: ast.NewIdent("http"), Sel: ast.NewIdent("ExpectedResponse")}, Lbrace: lit.Lbrace, Elts: lit.Elts, Rbrace: lit.Rbrace}
						}
						*out = append(*out, ownedLit{lit, owner})
					}
				}
				return false
			}
		}
		return true
	})
}

// value evaluates a literal expression of a test: strings, integers,
// string and float maps, string lists, struct literals, the suite's
// constants, the test's local definitions, string concatenation,
// http.Ipv6SafeHost and a client's Pod address. Anything else is an error
// that names it, so that a suite that states an expectation some other
// way fails here rather than being read wrong.
func (r *reader) value(e ast.Expr) (any, error) {
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > 50 {
		return nil, fmt.Errorf("%s: definitions nest too deep", r.pos(e))
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		switch e.Kind {
		case token.STRING:
			return strconv.Unquote(e.Value)
		case token.INT:
			return strconv.Atoi(e.Value)
		case token.FLOAT:
			return strconv.ParseFloat(e.Value, 64)
		}
	case *ast.Ident:
		switch e.Name {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		if d, ok := r.locals[e.Name]; ok {
			return r.value(d)
		}
	case *ast.SelectorExpr:
		if s, ok := r.consts[typeString(e)]; ok {
			return s, nil
		}
		if id, ok := e.X.(*ast.Ident); ok && e.Sel.Name == "Address" {
			if _, ok := r.clients[id.Name]; ok {
				return podAddress, nil
			}
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			a, err := r.value(e.X)
			if err != nil {
				return nil, err
			}
			b, err := r.value(e.Y)
			if err != nil {
				return nil, err
			}
			as, aok := a.(string)
			bs, bok := b.(string)
			if aok && bok {
				return as + bs, nil
			}
		}
	case *ast.CallExpr:
		if typeString(e.Fun) == "http.Ipv6SafeHost" && len(e.Args) == 1 {
			v, err := r.value(e.Args[0])
			if err != nil {
				return nil, err
			}
			if s, ok := v.(string); ok {
				if strings.Contains(s, ":") {
					return "[" + s + "]", nil
				}
				return s, nil
			}
		}
	case *ast.UnaryExpr:
		if e.Op == token.AND {
			return r.value(e.X)
		}
	case *ast.CompositeLit:
		return r.composite(e)
	}
	return nil, fmt.Errorf("%s: cannot read the expression %s", r.pos(e), typeString(e))
}

func (r *reader) composite(e *ast.CompositeLit) (any, error) {
	switch typ := typeString(e.Type); typ {
	case "[]string":
		out := []string{}
		for _, el := range e.Elts {
			v, err := r.value(el)
			if err != nil {
				return nil, err
			}
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("%s: not a string", r.pos(el))
			}
			out = append(out, s)
		}
		return out, nil
	case "map[string]string", "map[string]float64":
		ms, mf := map[string]string{}, map[string]float64{}
		for _, el := range e.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				return nil, fmt.Errorf("%s: a map element without a key", r.pos(el))
			}
			k, err := r.value(kv.Key)
			if err != nil {
				return nil, err
			}
			v, err := r.value(kv.Value)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%s: a key that is not a string", r.pos(kv.Key))
			}
			switch v := v.(type) {
			case string:
				ms[ks] = v
			case float64:
				mf[ks] = v
			case int:
				mf[ks] = float64(v)
			default:
				return nil, fmt.Errorf("%s: a value of type %T", r.pos(kv.Value), v)
			}
		}
		if typ == "map[string]float64" {
			return mf, nil
		}
		return ms, nil
	case "[]int":
		out := []int{}
		for _, el := range e.Elts {
			v, err := r.value(el)
			if err != nil {
				return nil, err
			}
			n, ok := v.(int)
			if !ok {
				return nil, fmt.Errorf("%s: not an integer", r.pos(el))
			}
			out = append(out, n)
		}
		return out, nil
	default:
		if strings.HasPrefix(typ, "[]") || strings.HasPrefix(typ, "map[") || typ == "" {
			return nil, fmt.Errorf("%s: cannot read a literal of type %q", r.pos(e), typ)
		}
		out := structLit{Type: typ, Fields: map[string]any{}}
		for _, el := range e.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				return nil, fmt.Errorf("%s: an unkeyed field of %s", r.pos(el), typ)
			}
			v, err := r.value(kv.Value)
			if err != nil {
				return nil, err
			}
			key, _ := kv.Key.(*ast.Ident)
			if key == nil {
				return nil, fmt.Errorf("%s: a field key of %s that is not a name", r.pos(kv.Key), typ)
			}
			out.Fields[key.Name] = v
		}
		return out, nil
	}
}

// expectationOf reads an http.ExpectedResponse literal into what the
// suite's mesh client does with it, with its TestCaseName. The defaults are
// the client's: Host "echo", method GET over HTTP, status 200; a Host whose
// port is HTTP's own, 80, is sent without it.
func expectationOf(v structLit) (expectation, string, error) {
	var e expectation
	var name string
	var statusCode int
	for k, f := range v.Fields {
		var err error
		switch k {
		case "TestCaseName":
			name, err = as[string](k, f)
		case "Backend":
			e.Backend, err = as[string](k, f)
		case "Request":
			err = e.request(f)
		case "Response":
			var resp structLit
			if resp, err = as[structLit](k, f); err != nil {
				break
			}
			for rk, rf := range resp.Fields {
				switch rk {
				case "StatusCode":
					statusCode, err = as[int](rk, rf)
				case "StatusCodes":
					e.StatusCodes, err = as[[]int](rk, rf)
				case "Headers":
					e.ResponseHeaders, err = as[map[string]string](rk, rf)
				case "AbsentHeaders":
					e.ResponseAbsent, err = as[[]string](rk, rf)
				}
				if err != nil {
					break
				}
			}
		case "ExpectedRequest":
			var er structLit
			if er, err = as[structLit](k, f); err != nil {
				break
			}
			if req, ok := er.Fields["Request"].(structLit); ok && req.Fields["Headers"] != nil {
				e.BackendHeaders, err = as[map[string]string]("ExpectedRequest.Headers", req.Fields["Headers"])
			}
			if err == nil && er.Fields["AbsentHeaders"] != nil {
				e.BackendAbsent, err = as[[]string]("ExpectedRequest.AbsentHeaders", er.Fields["AbsentHeaders"])
			}
		}
		if err != nil {
			return e, "", err
		}
	}
	if statusCode != 0 && !slices.Contains(e.StatusCodes, statusCode) {
		e.StatusCodes = append(e.StatusCodes, statusCode)
	}
	if len(e.StatusCodes) == 0 {
		e.StatusCodes = []int{200}
	}
	if e.Host == "" {
		e.Host = "echo"
	}
	e.Protocol = strings.ToLower(e.Protocol)
	if e.Protocol == "" {
		e.Protocol = "http"
	}
	if e.Protocol != "grpc" && e.Method == "" {
		e.Method = "GET"
	}
	if h, ok := strings.CutSuffix(e.Host, ":80"); ok && e.Protocol == "http" {
		e.Host = h
	}
	return e, name, nil
}

func (e *expectation) request(f any) error {
	req, err := as[structLit]("Request", f)
	if err != nil {
		return err
	}
	for k, v := range req.Fields {
		switch k {
		case "Host":
			e.Host, err = as[string](k, v)
		case "Method":
			e.Method, err = as[string](k, v)
		case "Path":
			e.Path, err = as[string](k, v)
		case "Protocol":
			e.Protocol, err = as[string](k, v)
		case "Headers":
			e.Headers, err = as[map[string]string](k, v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// as asserts a field's type.
func as[T any](field string, v any) (T, error) {
	t, ok := v.(T)
	if !ok {
		return t, fmt.Errorf("the field %s is a %T, want a %T", field, v, t)
	}
	return t, nil
}

// typeString spells a type or an expression as the source does, for the
// shapes tests use.
func typeString(e ast.Expr) string {
	switch e := e.(type) {
	case nil:
		return ""
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return typeString(e.X) + "." + e.Sel.Name
	case *ast.StarExpr:
		return "*" + typeString(e.X)
	case *ast.ArrayType:
		return "[]" + typeString(e.Elt)
	case *ast.MapType:
		return "map[" + typeString(e.Key) + "]" + typeString(e.Value)
	case *ast.CallExpr:
		return typeString(e.Fun) + "(…)"
	case *ast.BasicLit:
		return e.Value
	}
	return fmt.Sprintf("%T", e)
}
