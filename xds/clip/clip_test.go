package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc"},
		{"héllo", 2, "h"}, // é is two bytes: never split
		{"a\xffb", 10, "a\uFFFDb"},
		{"a\xffb", 3, "a"}, // the replacement is three bytes
		{"", 0, ""},
	} {
		if got := String(tc.in, tc.n); got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestQuoteBoundsAnyInput(t *testing.T) {
	huge := strings.Repeat("\xff\xfeé", 1<<20)
	q := Quote(huge)
	if len(q) > 4*QuoteBytes+64 {
		t.Fatalf("Quote of %d bytes is %d bytes long", len(huge), len(q))
	}
	if !utf8.ValidString(q) || !strings.HasSuffix(q, "(4194304 bytes)") {
		t.Fatalf("Quote = %q", q)
	}
	if got := Quote("ns/name"); got != `"ns/name"` {
		t.Fatalf("Quote of a short value = %s", got)
	}
}

func FuzzString(f *testing.F) {
	f.Add("a\xffb", 2)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		got := String(s, n)
		if len(got) > n || !utf8.ValidString(got) {
			t.Fatalf("String(%q, %d) = %q", s, n, got)
		}
		if len(s) <= n && utf8.ValidString(s) && got != s {
			t.Fatalf("String changed valid short input %q to %q", s, got)
		}
	})
}
