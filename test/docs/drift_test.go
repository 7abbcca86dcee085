// Package docs_test keeps the statements of the docs that name things the
// code defines (condition reasons, alerts, the flags the chart sets) equal to
// the code, so that a reason, an alert or a flag added in one place and not
// the other fails here with the name and the file to fix.
package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// repoRoot is the checkout, two levels above this package.
const repoRoot = "../.."

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// conditionReasons returns the Reason* string constants of api/v1alpha1,
// value to constant name: the reasons a ProxyScope condition can carry.
func conditionReasons(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	dir := filepath.Join(repoRoot, "api", "v1alpha1")
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Reason") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					reasons[v] = id.Name
				}
			}
		}
	}
	if len(reasons) == 0 {
		t.Fatal("api/v1alpha1 defines no Reason* constants: the parser found nothing")
	}
	return reasons
}

var backticked = regexp.MustCompile("`([^`]+)`")

// troubleshootingReasons returns the reasons the condition table of
// docs/troubleshooting.md names (its second column), with the line of each.
func troubleshootingReasons(t *testing.T) map[string]int {
	t.Helper()
	doc := read(t, "docs/troubleshooting.md")
	_, rest, ok := strings.Cut(doc, "| condition | reason | what it means | what to do |")
	if !ok {
		t.Fatal("docs/troubleshooting.md has no table with the header | condition | reason | what it means | what to do |")
	}
	offset := strings.Count(doc[:len(doc)-len(rest)], "\n")
	names := map[string]int{}
	for i, line := range strings.Split(rest, "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			if i > 1 {
				break
			}
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		for _, m := range backticked.FindAllStringSubmatch(cells[2], -1) {
			names[m[1]] = offset + i + 1
		}
	}
	return names
}

// TestTroubleshootingListsEveryConditionReason keeps the README's promise
// that docs/troubleshooting.md covers every condition reason: each Reason*
// constant of the API has a row there, and each reason a row names is one
// the API defines.
func TestTroubleshootingListsEveryConditionReason(t *testing.T) {
	reasons := conditionReasons(t)
	listed := troubleshootingReasons(t)
	for v, name := range reasons {
		if _, ok := listed[v]; !ok {
			t.Errorf("condition reason %q (api/v1alpha1.%s) is missing from the reason column of docs/troubleshooting.md's condition table: add a row saying what it means and what to do", v, name)
		}
	}
	for v, line := range listed {
		if _, ok := reasons[v]; !ok {
			t.Errorf("docs/troubleshooting.md:%d names condition reason %q, which api/v1alpha1 does not define (no Reason* constant has that value): fix or remove the row", line, v)
		}
	}
}

// alertNames returns the alerts of the chart's files/alerts.yaml.
func alertNames(t *testing.T) []string {
	t.Helper()
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal([]byte(read(t, "charts/scopeplane/files/alerts.yaml")), &rules); err != nil {
		t.Fatalf("charts/scopeplane/files/alerts.yaml: %v", err)
	}
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("charts/scopeplane/files/alerts.yaml defines no alert")
	}
	return names
}

var alertName = regexp.MustCompile(`\bScopeplane[A-Z][A-Za-z0-9]*\b`)

// TestAlertsNamedInDocs keeps the lists of alerts equal to the alerts the
// chart ships: values.yaml (and so install.md's values reference) and
// metrics.md name every alert of files/alerts.yaml, and no file of the docs
// names an alert that does not exist.
func TestAlertsNamedInDocs(t *testing.T) {
	alerts := alertNames(t)
	for _, file := range []string{"charts/scopeplane/values.yaml", "docs/install.md", "docs/metrics.md"} {
		text := read(t, file)
		for _, a := range alerts {
			if !strings.Contains(text, a) {
				t.Errorf("alert %s (charts/scopeplane/files/alerts.yaml) is not named in %s: add it to its list of alerts", a, file)
			}
		}
	}
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", "charts/scopeplane/values.yaml", "charts/scopeplane/templates/NOTES.txt"}
	for _, d := range docs {
		rel, _ := filepath.Rel(repoRoot, d)
		files = append(files, filepath.ToSlash(rel))
	}
	for _, file := range files {
		for i, line := range strings.Split(read(t, file), "\n") {
			for _, name := range alertName.FindAllString(line, -1) {
				if !slices.Contains(alerts, name) {
					t.Errorf("%s:%d names alert %s, which charts/scopeplane/files/alerts.yaml does not define", file, i+1, name)
				}
			}
		}
	}
}

var (
	templateFlag = regexp.MustCompile(`^\s*- --([a-z0-9-]+)`)
	docFlag      = regexp.MustCompile("`--([a-z0-9-]+)")
	tableFlag    = regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\|")
)

// TestChartFlagsDocumented keeps docs/flags.md's list of "what the chart
// sets" equal to the flags the chart's Deployment template passes, and each
// of those a flag the binary defines (a row of the generated table).
func TestChartFlagsDocumented(t *testing.T) {
	chart := map[string]bool{}
	for _, line := range strings.Split(read(t, "charts/scopeplane/templates/deployment.yaml"), "\n") {
		if m := templateFlag.FindStringSubmatch(line); m != nil {
			chart[m[1]] = true
		}
	}
	if len(chart) == 0 {
		t.Fatal("charts/scopeplane/templates/deployment.yaml passes no flag: the pattern found nothing")
	}
	doc := read(t, "docs/flags.md")
	intro, table, ok := strings.Cut(doc, "| Flag | Default | Description |")
	if !ok {
		t.Fatal("docs/flags.md has no flag table")
	}
	_, sets, ok := strings.Cut(intro, "The Helm chart")
	if !ok {
		t.Fatal(`docs/flags.md does not say what the chart sets (a paragraph starting "The Helm chart")`)
	}
	listed := map[string]bool{}
	for _, m := range docFlag.FindAllStringSubmatch(sets, -1) {
		listed[m[1]] = true
	}
	defined := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		if m := tableFlag.FindStringSubmatch(line); m != nil {
			defined[m[1]] = true
		}
	}
	for f := range chart {
		if !listed[f] {
			t.Errorf("the chart sets --%s (charts/scopeplane/templates/deployment.yaml) but docs/flags.md's list of what the chart sets does not name it: add it to flagsHeader in main_test.go and run go test . -run TestFlagsReference -update", f)
		}
		if !defined[f] {
			t.Errorf("the chart sets --%s (charts/scopeplane/templates/deployment.yaml), which the binary does not define (no row in docs/flags.md's table)", f)
		}
	}
	for f := range listed {
		if !chart[f] {
			t.Errorf("docs/flags.md says the chart sets --%s, but charts/scopeplane/templates/deployment.yaml never passes it: fix flagsHeader in main_test.go", f)
		}
	}
}

// quickstartFile is a fenced block of the quickstart that shows a file: the
// comment naming the file, then the block.
var quickstartFile = regexp.MustCompile("(?s)<!-- (docs/quickstart/[^ ]+) -->\n```yaml\n(.*?)```\n")

// TestQuickstartShowsItsFiles holds the quickstart's manifests equal to the
// files `kubectl apply -f` takes and `make e2e` applies on a real node, and
// the project's images in them to the tag the chart deploys: a manifest
// edited on the page only, or a file the page does not show, fails here.
func TestQuickstartShowsItsFiles(t *testing.T) {
	page := read(t, "docs/quickstart-kind.md")
	shown := map[string]bool{}
	for _, m := range quickstartFile.FindAllStringSubmatch(page, -1) {
		shown[m[1]] = true
		if file := read(t, m[1]); m[2] != file {
			t.Errorf("docs/quickstart-kind.md shows %s other than it is: copy the file into the page", m[1])
		}
		if !strings.Contains(page, "kubectl apply -f "+m[1]+"\n") {
			t.Errorf("docs/quickstart-kind.md shows %s but does not apply it", m[1])
		}
	}
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "quickstart", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no docs/quickstart/*.yaml")
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(read(t, "charts/scopeplane/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	image := regexp.MustCompile(`image: (\S+)`)
	for _, f := range files {
		rel := "docs/quickstart/" + filepath.Base(f)
		if !shown[rel] {
			t.Errorf("docs/quickstart-kind.md does not show %s: add it after a line <!-- %s -->", rel, rel)
		}
		for _, m := range image.FindAllStringSubmatch(read(t, rel), -1) {
			if want := "ghcr.io/scopeplane/scopeplane-demo:" + chart.AppVersion; strings.HasPrefix(m[1], "ghcr.io/scopeplane/") && m[1] != want {
				t.Errorf("%s runs the image %s, want %s (the chart's appVersion, what make image tags)", rel, m[1], want)
			}
		}
	}
}
