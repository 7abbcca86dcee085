package bootstrap

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/scopeplane/scopeplane/xds/auth"
)

// TestGRPCChannelCredsOfferTLSThenGoogleDefault checks the order each gRPC
// client picks from: grpc-go takes tls (the first it knows), grpc-js-xds
// and C-core, which know no tls, google_default; a plaintext port offers
// only insecure. The client matrix runs all three on it.
func TestGRPCChannelCredsOfferTLSThenGoogleDefault(t *testing.T) {
	for _, tc := range []struct {
		tls  *TLS
		want []string
	}{
		{&TLS{CAFile: "/etc/scopeplane/xds/ca.crt", Token: true}, []string{"tls", "google_default"}},
		{nil, []string{"insecure"}},
	} {
		out, err := GRPC(scope, "scopeplane.system.svc:18000", tc.tls)
		if err != nil {
			t.Fatal(err)
		}
		var b struct {
			XDSServers []struct {
				ChannelCreds []struct {
					Type string `json:"type"`
				} `json:"channel_creds"`
			} `json:"xds_servers"`
		}
		if err := json.Unmarshal(out, &b); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range b.XDSServers[0].ChannelCreds {
			got = append(got, c.Type)
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("channel_creds %v, want %v:\n%s", got, tc.want, out)
		}
	}
}

// TestTLSOnlyKey checks that a new published key is a service-account key
// both clients read, under the key id the server treats as no credential,
// and that a key that is not one is not kept.
func TestTLSOnlyKey(t *testing.T) {
	k, err := NewTLSOnlyKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckTLSOnlyKey(k); err != nil {
		t.Fatalf("a new key does not check: %v\n%s", err, k)
	}
	var parsed map[string]string
	if err := json.Unmarshal(k, &parsed); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"type", "private_key_id", "private_key", "client_email", "client_id"} {
		if parsed[field] == "" {
			t.Errorf("the key has no %s, which gRPC C-core requires:\n%s", field, k)
		}
	}
	if parsed["private_key_id"] != auth.PublishedKeyID || parsed["type"] != "service_account" {
		t.Errorf("key id %q type %q, want %q service_account", parsed["private_key_id"], parsed["type"], auth.PublishedKeyID)
	}
	other, err := NewTLSOnlyKey()
	if err != nil {
		t.Fatal(err)
	}
	if string(other) == string(k) {
		t.Error("two new keys are equal: each install must make its own")
	}
	for _, bad := range []string{"", "{}", `{"type":"service_account","private_key_id":"` + auth.PublishedKeyID + `","client_email":"tls-only@scopeplane.invalid","client_id":"0","private_key":"x"}`,
		strings.Replace(string(k), auth.PublishedKeyID, "someone-else", 1)} {
		if CheckTLSOnlyKey([]byte(bad)) == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// TestGRPCEnv checks the env-file: every line a comment or NAME=value with
// a C identifier for NAME, the bootstrap path always, and with TLS the
// variables each client needs, naming the ConfigMap's files.
func TestGRPCEnv(t *testing.T) {
	line := regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)
	parse := func(env []byte) map[string]string {
		vars := map[string]string{}
		for _, l := range strings.Split(strings.TrimSuffix(string(env), "\n"), "\n") {
			if strings.HasPrefix(l, "#") {
				continue
			}
			m := line.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("line %q is neither a comment nor NAME=value", l)
			}
			vars[m[1]] = m[2]
		}
		return vars
	}
	got := parse(GRPCEnv("/etc/scopeplane/xds", &TLS{CAFile: "/etc/scopeplane/xds/ca.crt", Token: true}))
	want := map[string]string{
		"GRPC_XDS_BOOTSTRAP":                         "/etc/scopeplane/xds/grpc-bootstrap.json",
		"GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS": "true",
		"GOOGLE_APPLICATION_CREDENTIALS":             "/etc/scopeplane/xds/tls-only-key.json",
		"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH":           "/etc/scopeplane/xds/ca.crt",
	}
	if len(got) != len(want) {
		t.Errorf("variables %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if got := parse(GRPCEnv("/etc/scopeplane/xds", nil)); len(got) != 1 || got["GRPC_XDS_BOOTSTRAP"] == "" {
		t.Errorf("plaintext: variables %v, want GRPC_XDS_BOOTSTRAP alone", got)
	}
	if got := parse(GRPCEnv("/etc/scopeplane/xds", &TLS{CAFile: "/etc/scopeplane/xds/ca.crt", SPIFFEDir: SPIFFEDir})); got["GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS"] != "" {
		t.Errorf("without tokens the bootstrap has no call_creds, yet the env turns them on: %v", got)
	}
}
