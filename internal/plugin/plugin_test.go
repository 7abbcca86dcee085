package plugin

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Command lines that cannot run fail with exit code 2 and say what to fix,
// before anything is dialled.
func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		says string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"proxy-status", "no-slash"}, `"no-slash" is not <namespace>/<scope>`},
		{[]string{"proxy-status", "a/b", "c/d"}, "at most one"},
		{[]string{"proxy-status", "-o", "yaml"}, `-o "yaml": want wide or json`},
		{[]string{"config-dump"}, "config-dump takes one <namespace>/<scope>"},
		{[]string{"config-dump", "a/b", "--type", "secrets"}, `--type "secrets"`},
		{[]string{"explain", "node-1"}, "explain takes <proxy node id> <namespace>/<service>"},
		{[]string{"explain", "node-1", "svc"}, `"svc" is not <namespace>/<service>`},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), append(c.args, "--address", "127.0.0.1:1"), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), c.says) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut.String(), c.says)
		}
	}
}
