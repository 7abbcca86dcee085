package feedback

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/xds/model"
)

func TestCut(t *testing.T) {
	cases := []struct {
		name             string
		in               string
		maxChars, maxLen int
		want             string
	}{
		{"short text is kept", "bad route", 10, 100, "bad route"},
		{"cut by characters, not bytes", "ñññ", 2, 100, "ññ"},
		{"cut by bytes at a character's start", "a€€", 10, 6, "a€"},
		{"invalid bytes become U+FFFD", "a\xffb\xfe\xfd", 10, 100, "a\uFFFDb\uFFFD\uFFFD"},
		{"a replacement counts as one character", "\xff\xff\xff\xff", 2, 100, "\uFFFD\uFFFD"},
		{"a replacement is three bytes", "ab\xff", 10, 4, "ab"},
		{"a split character is cut, not kept broken", "€€"[:5], 10, 100, "€\uFFFD\uFFFD"},
		{"empty", "", 1, 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Cut(tc.in, tc.maxChars, tc.maxLen)
			if got != tc.want {
				t.Errorf("Cut(%q, %d, %d) = %q, want %q", tc.in, tc.maxChars, tc.maxLen, got, tc.want)
			}
			if !utf8.ValidString(got) || utf8.RuneCountInString(got) > tc.maxChars || len(got) > tc.maxLen {
				t.Errorf("Cut(%q) = %q breaks its own limits", tc.in, got)
			}
		})
	}
}

// TestNACKTextIsCutToTheCRD: whatever a proxy sends as node id and
// error_detail, the NACK kept fits status.recentNACKs, and the limits here
// are the CRD's own.
func TestNACKTextIsCutToTheCRD(t *testing.T) {
	crd, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", "xds.scopeplane.dev_proxyscopes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Status struct {
								Properties struct {
									RecentNACKs struct {
										Items struct {
											Properties map[string]struct {
												MaxLength *int `json:"maxLength"`
											} `json:"properties"`
										} `json:"items"`
									} `json:"recentNACKs"`
								} `json:"properties"`
							} `json:"status"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(crd, &doc); err != nil || len(doc.Spec.Versions) != 1 {
		t.Fatalf("reading the CRD: %v (%d versions)", err, len(doc.Spec.Versions))
	}
	fields := doc.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Status.Properties.RecentNACKs.Items.Properties
	for field, want := range map[string]int{"node": MaxNodeChars, "typeURL": MaxTypeURLChars, "version": MaxVersionChars, "detail": MaxDetailChars} {
		if got := fields[field].MaxLength; got == nil || *got != want {
			t.Errorf("status.recentNACKs[].%s: the CRD's maxLength is %v, the tracker cuts to %d", field, got, want)
		}
	}

	tr := New(0)
	key := model.Key{Namespace: "ns", Name: "web"}
	node := strings.Repeat("ñ", 300) + "\xff"
	id := tr.Connect(key, &corev3.Node{Id: node}, model.SotW, "", "", model.Location{})
	tr.NACKed(key, id, "type.googleapis.com/"+strings.Repeat("t", 300), strings.Repeat("v", 200), strings.Repeat("bad \xff\xfe ", 2000), HeldBack{})
	n := tr.Get(key).NACKs[0]
	for field, c := range map[string]struct {
		got string
		max int
	}{"node": {n.Node, MaxNodeChars}, "typeURL": {n.TypeURL, MaxTypeURLChars}, "version": {n.Version, MaxVersionChars}, "detail": {n.Detail, MaxDetailChars}} {
		if !utf8.ValidString(c.got) || utf8.RuneCountInString(c.got) != c.max {
			t.Errorf("%s: %d characters, valid UTF-8 %v; want exactly %d valid characters", field, utf8.RuneCountInString(c.got), utf8.ValidString(c.got), c.max)
		}
	}
	if n.Node != NodeID(node) || !strings.HasPrefix(n.Detail, "bad \uFFFD\uFFFD bad") {
		t.Errorf("the NACK's node is not NodeID of the proxy's, or its detail lost its text: %.40q, %.40q", n.Node, n.Detail)
	}
	if p := tr.Get(key).Proxies[id]; p.Node != node {
		t.Error("the connected proxy's own node id was changed")
	}
	if Cut(n.Detail, math.MaxInt, math.MaxInt) != n.Detail {
		t.Error("a cut text is not stable under another cut")
	}
}
