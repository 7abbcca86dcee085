package chart_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/internal/localapi"
)

// The values reference sits between these markers in each of
// referencePages.
const (
	referenceBegin = "<!-- values reference: generated from charts/scopeplane/values.yaml by `go test ./test/chart -run TestValuesReference -update`; do not edit -->"
	referenceEnd   = "<!-- end of the values reference -->"
)

// referencePages hold the values reference: the install guide, and the
// chart's README, which `helm show readme` and chart registries show.
var referencePages = []string{
	filepath.Join("docs", "install.md"),
	filepath.Join("charts", "scopeplane", "README.md"),
}

// TestValuesReference generates the values reference from the `# --`
// comments of values.yaml and the types of values.schema.json, and fails
// when a page of referencePages does not hold it (-update rewrites them),
// when a value is undocumented, or when the schema and values.yaml disagree
// on the keys.
func TestValuesReference(t *testing.T) {
	table, err := valuesReference(
		mustRead(t, filepath.Join(chartDir, "values.yaml")),
		mustRead(t, filepath.Join(chartDir, "values.schema.json")))
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range referencePages {
		path := filepath.Join(localapi.RepoRoot(), page)
		doc := string(mustRead(t, path))
		before, rest, ok1 := strings.Cut(doc, referenceBegin+"\n")
		current, after, ok2 := strings.Cut(rest, referenceEnd)
		if !ok1 || !ok2 {
			t.Errorf("%s lacks the markers of the values reference:\n%s\n%s", page, referenceBegin, referenceEnd)
			continue
		}
		if *update {
			doc = before + referenceBegin + "\n" + table + referenceEnd + after
			if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			current = table
		}
		if diff := cmp.Diff(current, table); diff != "" {
			t.Errorf("the values reference in %s is stale (-page +values.yaml); run `go test ./test/chart -run TestValuesReference -update`:\n%s", page, diff)
		}
	}
}

// documentedValue is one `# --` comment of values.yaml and the key under it.
type documentedValue struct {
	path        []string
	description string
}

var keyLine = regexp.MustCompile(`^( *)([A-Za-z0-9_.-]+):(\s.*)?$`)

// parseValueComments reads the `# --` comments (helm-docs style: a comment
// that starts with `# --`, continued by the `#` lines under it, documents the
// key that follows) and the key path of each.
func parseValueComments(values []byte) ([]documentedValue, error) {
	type open struct {
		indent int
		key    string
	}
	var (
		stack   []open
		pending []string
		inDoc   bool
		out     []documentedValue
	)
	sc := bufio.NewScanner(bytes.NewReader(values))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "# --"):
			pending, inDoc = []string{strings.TrimSpace(strings.TrimPrefix(trimmed, "# --"))}, true
			continue
		case strings.HasPrefix(trimmed, "#"):
			if inDoc {
				pending = append(pending, strings.TrimSpace(strings.TrimPrefix(trimmed, "#")))
			}
			continue
		case trimmed == "":
			if inDoc {
				return nil, fmt.Errorf("values.yaml:%d: a blank line separates a `# --` comment from its key", n)
			}
			continue
		}
		m := keyLine.FindStringSubmatch(line)
		if m == nil { // a list item or a continuation inside a value
			if inDoc {
				return nil, fmt.Errorf("values.yaml:%d: a `# --` comment is not followed by a key", n)
			}
			continue
		}
		indent := len(m[1])
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		stack = append(stack, open{indent, m[2]})
		if inDoc {
			var path []string
			for _, o := range stack {
				path = append(path, o.key)
			}
			out = append(out, documentedValue{path: path, description: strings.Join(pending, " ")})
			pending, inDoc = nil, false
		}
	}
	return out, sc.Err()
}

// valuesReference renders the markdown table of every documented value.
func valuesReference(valuesYAML, schemaJSON []byte) (string, error) {
	documented, err := parseValueComments(valuesYAML)
	if err != nil {
		return "", err
	}
	var values map[string]any
	if err := yaml.Unmarshal(valuesYAML, &values); err != nil {
		return "", fmt.Errorf("values.yaml: %w", err)
	}
	var schema map[string]any
	if err := json.Unmarshal(schemaJSON, &schema); err != nil {
		return "", fmt.Errorf("values.schema.json: %w", err)
	}

	var problems []string
	isDocumented := map[string]bool{}
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n| --- | --- | --- | --- |\n")
	for _, d := range documented {
		key := strings.Join(d.path, ".")
		isDocumented[key] = true
		def, ok := lookup(values, d.path)
		if !ok {
			problems = append(problems, fmt.Sprintf("values.yaml documents %s but does not set it", key))
			continue
		}
		typ, err := schemaType(schema, d.path)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		defJSON, err := json.Marshal(def)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s |\n", key, typ, cell(string(defJSON)), cell(d.description))
	}

	// Every value is documented, itself or through a documented parent.
	for _, leaf := range leaves(values, nil) {
		covered := false
		for i := 1; i <= len(leaf); i++ {
			covered = covered || isDocumented[strings.Join(leaf[:i], ".")]
		}
		if !covered {
			problems = append(problems, fmt.Sprintf("values.yaml: %s has no `# --` comment", strings.Join(leaf, ".")))
		}
	}
	// Every value the schema describes exists in values.yaml.
	for _, p := range schemaPaths(schema, nil) {
		if _, ok := lookup(values, p); !ok && p[0] != "global" {
			problems = append(problems, fmt.Sprintf("values.schema.json describes %s, which values.yaml does not set", strings.Join(p, ".")))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return "", fmt.Errorf("the values reference cannot be generated:\n%s", strings.Join(slices.Compact(problems), "\n"))
	}
	return b.String(), nil
}

// cell escapes text for a markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func lookup(values map[string]any, path []string) (any, bool) {
	var v any = values
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[p]; !ok {
			return nil, false
		}
	}
	return v, true
}

// leaves lists the paths of the values that are not non-empty maps.
func leaves(v any, path []string) [][]string {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 && path != nil {
		return [][]string{path}
	}
	var out [][]string
	for k, child := range m {
		out = append(out, leaves(child, append(slices.Clip(path), k))...)
	}
	slices.SortFunc(out, func(a, b []string) int { return strings.Compare(strings.Join(a, "."), strings.Join(b, ".")) })
	return out
}

// schemaPaths lists the paths of every property the schema declares.
func schemaPaths(schema map[string]any, path []string) [][]string {
	props, _ := schema["properties"].(map[string]any)
	var out [][]string
	for k, sub := range props {
		p := append(slices.Clip(path), k)
		out = append(out, p)
		if s, ok := sub.(map[string]any); ok {
			out = append(out, schemaPaths(s, p)...)
		}
	}
	return out
}

// schemaType describes the JSON type the schema allows at path, following
// local $refs; a value the schema does not describe is an error.
func schemaType(root map[string]any, path []string) (string, error) {
	s := root
	for _, p := range path {
		props, _ := s["properties"].(map[string]any)
		next, ok := props[p].(map[string]any)
		if !ok {
			return "", fmt.Errorf("values.schema.json does not describe %s", strings.Join(path, "."))
		}
		s = resolve(root, next)
	}
	var types []string
	switch t := s["type"].(type) {
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			types = append(types, fmt.Sprint(x))
		}
	default:
		return "", fmt.Errorf("values.schema.json gives %s no type", strings.Join(path, "."))
	}
	return strings.Join(types, " or "), nil
}

func resolve(root, s map[string]any) map[string]any {
	ref, ok := s["$ref"].(string)
	if !ok {
		return s
	}
	var v any = root
	for _, p := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	m, _ := v.(map[string]any)
	return m
}
