package bootstrap

import (
	"bytes"
	"flag"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	credentialinjectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/credential_injector/v3"
	genericv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/injected_credentials/generic/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/xds/model"
)

var update = flag.Bool("update", false, "rewrite testdata/envoy/<variant>/ from the rendered Envoy bootstraps and SDS files")

const caFile = MountPath + "/" + CAKey

// envoyVariant is one way the operator can be run, and what it renders
// for Envoy.
type envoyVariant struct {
	name     string
	protocol model.Protocol
	server   string
	tls      *TLS
}

var envoyVariants = []envoyVariant{
	{"plaintext-sotw", model.SotW, "scopeplane.system.svc:18000", nil},
	{"plaintext-delta-ip", model.Delta, "10.0.0.7:18000", nil},
	{"tls-token", model.SotW, "scopeplane.system.svc:18000", &TLS{CAFile: caFile, Token: true}},
	{"tls-token-delta-ip", model.Delta, "10.0.0.7:18000", &TLS{CAFile: caFile, Token: true}},
	{"tls-spiffe", model.SotW, "scopeplane.system.svc:18000", &TLS{CAFile: caFile, SPIFFEDir: SPIFFEDir}},
	{"tls-token-spiffe", model.SotW, "scopeplane.system.svc:18000", &TLS{CAFile: caFile, Token: true, SPIFFEDir: SPIFFEDir}},
	{"tls-anonymous", model.SotW, "scopeplane.system.svc:18000", &TLS{CAFile: caFile}},
}

// renderEnvoy returns every Envoy file of a variant by ConfigMap key, as
// the bootstrap ConfigMap would hold them.
func renderEnvoy(t *testing.T, v envoyVariant) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	out, err := Envoy(scope, v.protocol, v.server, v.tls)
	if err != nil {
		t.Fatal(err)
	}
	files[EnvoyKey] = out
	for key, render := range map[string]func(*TLS) ([]byte, error){SDSKey: EnvoySDS, CASDSKey: EnvoyCASDS, TokenSDSKey: EnvoyTokenSDS} {
		out, err := render(v.tls)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			files[key] = out
		}
	}
	return files
}

// TestEnvoyGoldens compares every variant's files with
// testdata/envoy/<variant>/, validates the files as stored there against
// Envoy's API, and fails on a golden file the variant no longer renders.
func TestEnvoyGoldens(t *testing.T) {
	for _, v := range envoyVariants {
		t.Run(v.name, func(t *testing.T) {
			dir := filepath.Join("testdata", "envoy", v.name)
			files := renderEnvoy(t, v)
			if *update {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for key, out := range files {
					if err := os.WriteFile(filepath.Join(dir, key), out, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatalf("%v (run go test -update to write the goldens)", err)
			}
			for _, e := range entries {
				if _, ok := files[e.Name()]; !ok {
					t.Errorf("%s/%s is golden but no longer rendered", dir, e.Name())
				}
			}
			for key, out := range files {
				golden, err := os.ReadFile(filepath.Join(dir, key))
				if err != nil {
					t.Errorf("%s is rendered but has no golden: %v", key, err)
					continue
				}
				if !bytes.Equal(out, golden) {
					t.Errorf("%s differs from %s/%s (run go test -update, then review):\n%s", key, dir, key, out)
				}
				validate := ValidateEnvoySDS
				if key == EnvoyKey {
					validate = ValidateEnvoy
				}
				if err := validate(golden); err != nil {
					t.Errorf("%s/%s is not valid for Envoy: %v", dir, key, err)
				}
			}
		})
	}
}

// parseEnvoy reads an Envoy bootstrap back as Envoy would.
func parseEnvoy(t *testing.T, y []byte) *bootstrapv3.Bootstrap {
	t.Helper()
	js, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		t.Fatalf("not an Envoy bootstrap: %v\n%s", err, y)
	}
	return b
}

// parseSecret reads the one Secret of a file-based SDS resource.
func parseSecret(t *testing.T, y []byte) *tlsv3.Secret {
	t.Helper()
	js, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	resp := &discoveryv3.DiscoveryResponse{}
	if err := protojson.Unmarshal(js, resp); err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("the SDS file is not one resource: %v\n%s", err, y)
	}
	s := &tlsv3.Secret{}
	if err := resp.GetResources()[0].UnmarshalTo(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestEnvoyPresentsTheCredentialTheServerAccepts checks, per --xds-auth,
// what Envoy sends: with tokens only (the chart's default) the projected
// token, injected by the xDS cluster's upstream filters as "authorization:
// Bearer <token>" from the token SDS file; with SPIFFE the certificate and
// no token; over plaintext nothing. Every TLS variant trusts the CA through
// the CA SDS file and keeps the SAN check on the server's name.
func TestEnvoyPresentsTheCredentialTheServerAccepts(t *testing.T) {
	for _, v := range envoyVariants {
		t.Run(v.name, func(t *testing.T) {
			files := renderEnvoy(t, v)
			b := parseEnvoy(t, files[EnvoyKey])
			c := b.GetStaticResources().GetClusters()[0]
			opts := &upstreamhttpv3.HttpProtocolOptions{}
			if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(opts); err != nil {
				t.Fatal(err)
			}
			if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
				t.Errorf("the xDS cluster is not explicitly HTTP/2")
			}
			wantToken := v.tls != nil && v.tls.Token && v.tls.SPIFFEDir == ""
			wantCert := v.tls != nil && v.tls.SPIFFEDir != ""
			filters := opts.GetHttpFilters()
			_, hasTokenFile := files[TokenSDSKey]
			_, hasCertFile := files[SDSKey]
			_, hasCAFile := files[CASDSKey]
			if hasTokenFile != wantToken || hasCertFile != wantCert || hasCAFile != (v.tls != nil) {
				t.Errorf("files %v: want token SDS %v, certificate SDS %v, CA SDS %v", slices.Sorted(mapsKeys(files)), wantToken, wantCert, v.tls != nil)
			}
			if !wantToken {
				if len(filters) != 0 {
					t.Errorf("Envoy injects a credential the server does not take from it: %v", filters)
				}
			} else {
				if len(filters) != 2 || filters[0].GetName() != "envoy.filters.http.credential_injector" || filters[1].GetName() != "envoy.filters.http.upstream_codec" {
					t.Fatalf("upstream filters %v, want the credential injector then the upstream codec", filters)
				}
				inj := &credentialinjectorv3.CredentialInjector{}
				if err := filters[0].GetTypedConfig().UnmarshalTo(inj); err != nil {
					t.Fatal(err)
				}
				gen := &genericv3.Generic{}
				if err := inj.GetCredential().GetTypedConfig().UnmarshalTo(gen); err != nil {
					t.Fatal(err)
				}
				// Envoy's default header is Authorization; HTTP/2 sends it
				// lower-cased, which is the gRPC metadata the server reads.
				if !inj.GetOverwrite() || inj.GetAllowRequestWithoutCredential() || gen.GetHeader() != "" || gen.GetHeaderValuePrefix() != "Bearer " {
					t.Errorf("the injector does not send exactly \"authorization: Bearer <token>\": %v %v", inj, gen)
				}
				src := gen.GetCredential().GetSdsConfig().GetPathConfigSource()
				if src.GetPath() != MountPath+"/"+TokenSDSKey || src.GetWatchedDirectory().GetPath() != MountPath {
					t.Errorf("the token SDS is read from %q watching %q", src.GetPath(), src.GetWatchedDirectory().GetPath())
				}
				s := parseSecret(t, files[TokenSDSKey])
				if s.GetName() != gen.GetCredential().GetName() || s.GetGenericSecret().GetSecret().GetFilename() != TokenPath {
					t.Errorf("the token SDS file does not name %s as secret %q:\n%s", TokenPath, gen.GetCredential().GetName(), files[TokenSDSKey])
				}
			}
			ts := c.GetTransportSocket()
			if v.tls == nil {
				if ts != nil {
					t.Errorf("a plaintext bootstrap has a transport socket")
				}
				return
			}
			up := &tlsv3.UpstreamTlsContext{}
			if err := ts.GetTypedConfig().UnmarshalTo(up); err != nil {
				t.Fatal(err)
			}
			host := strings.Split(v.server, ":")[0]
			combined := up.GetCommonTlsContext().GetCombinedValidationContext()
			sans := combined.GetDefaultValidationContext().GetMatchTypedSubjectAltNames()
			if up.GetSni() != host || len(sans) != 1 || sans[0].GetMatcher().GetExact() != host || combined.GetDefaultValidationContext().GetTrustedCa() != nil {
				t.Errorf("want SNI and the one SAN %s and no CA in the bootstrap: %v", host, up)
			}
			sds := combined.GetValidationContextSdsSecretConfig()
			src := sds.GetSdsConfig().GetPathConfigSource()
			if src.GetPath() != MountPath+"/"+CASDSKey || src.GetWatchedDirectory().GetPath() != MountPath {
				t.Errorf("the CA SDS is read from %q watching %q", src.GetPath(), src.GetWatchedDirectory().GetPath())
			}
			ca := parseSecret(t, files[CASDSKey])
			vc := ca.GetValidationContext()
			if ca.GetName() != sds.GetName() || vc.GetTrustedCa().GetFilename() != caFile || vc.GetWatchedDirectory().GetPath() != MountPath {
				t.Errorf("the CA SDS file does not name %s watching %s as secret %q:\n%s", caFile, MountPath, sds.GetName(), files[CASDSKey])
			}
			if got := len(up.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs()) == 1; got != wantCert {
				t.Errorf("Envoy presents a certificate: %v, want %v", got, wantCert)
			}
		})
	}
}

func mapsKeys(m map[string][]byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestValidateEnvoyIsStrictAndDeep feeds ValidateEnvoy and ValidateEnvoySDS
// what Envoy would refuse. The rows inside a typed config pass the
// bootstrap's own ValidateAll, which stops at an Any: the check must reach
// into it.
func TestValidateEnvoyIsStrictAndDeep(t *testing.T) {
	files := renderEnvoy(t, envoyVariants[2]) // tls-token
	good := string(files[EnvoyKey])
	for _, c := range []struct {
		name, old, new string
		shallowPasses  bool
	}{
		{"unknown bootstrap field", "node:\n", "nodes: {}\nnode:\n", false},
		{"unknown field in a typed config", "header_value_prefix: 'Bearer '", "header_value_prefx: 'Bearer '", false},
		{"unregistered typed config", "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec", "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v9.UpstreamCodec", false},
		{"SNI longer than 255 bytes", "sni: scopeplane.system.svc", "sni: " + strings.Repeat("s", 300), true},
		{"empty CA SDS path", "path: /etc/scopeplane/xds/envoy-sds-ca.yaml", "path: ''", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(good, c.old) {
				t.Fatalf("the rendered bootstrap has no %q:\n%s", c.old, good)
			}
			bad := []byte(strings.Replace(good, c.old, c.new, 1))
			if err := ValidateEnvoy(bad); err == nil {
				t.Errorf("accepted:\n%s", bad)
			} else {
				t.Logf("refused: %v", err)
			}
			if !c.shallowPasses {
				return
			}
			// The same input passes the bootstrap's own ValidateAll: only
			// the deep check catches it.
			js, err := yaml.YAMLToJSON(bad)
			if err != nil {
				t.Fatal(err)
			}
			b := &bootstrapv3.Bootstrap{}
			if err := protojson.Unmarshal(js, b); err != nil {
				t.Fatal(err)
			}
			if err := b.ValidateAll(); err != nil {
				t.Errorf("the shallow ValidateAll refuses it already (%v): the row does not test the deep check", err)
			}
		})
	}
	// The injector's required credential, removed from the parsed
	// message: refused inside the typed config.
	b := parseEnvoy(t, files[EnvoyKey])
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	key := "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	if err := b.GetStaticResources().GetClusters()[0].GetTypedExtensionProtocolOptions()[key].UnmarshalTo(opts); err != nil {
		t.Fatal(err)
	}
	inj := &credentialinjectorv3.CredentialInjector{}
	if err := opts.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(inj); err != nil {
		t.Fatal(err)
	}
	inj.Credential = nil
	if err := opts.GetHttpFilters()[0].GetTypedConfig().MarshalFrom(inj); err != nil {
		t.Fatal(err)
	}
	if err := b.GetStaticResources().GetClusters()[0].GetTypedExtensionProtocolOptions()[key].MarshalFrom(opts); err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("the shallow ValidateAll refuses an injector without credential already: %v", err)
	}
	out, err := toYAML(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidateEnvoy(out); err == nil || !strings.Contains(err.Error(), "Credential") {
		t.Errorf("an injector without a credential: %v, want refused naming Credential", err)
	}

	// SDS files: one Secret, strictly.
	sds := string(files[CASDSKey])
	for name, bad := range map[string]string{
		"two secrets":   sds + strings.Replace(strings.TrimPrefix(sds, "resources:\n"), "scopeplane-ca", "other", 1),
		"unknown field": strings.Replace(sds, "trusted_ca:", "trusted_cas:", 1),
		"no secret":     "resources: []\n",
		"not a secret":  "resources:\n- '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: x\n",
	} {
		if err := ValidateEnvoySDS([]byte(bad)); err == nil {
			t.Errorf("SDS file with %s accepted:\n%s", name, bad)
		}
	}
}

// TestCARotationChangesOnlyWhatTheSDSFileNames mounts the rendered files
// in a temporary directory the way the kubelet mounts a ConfigMap (each
// key a link through ..data to a timestamped directory) and then rotates
// the CA the way the kubelet does, by renaming a new ..data link into
// place. Every rendered file reads the same afterwards; only the file the
// CA SDS secret names has the new CA, and the rename is an event in the
// directory the secret watches, which is what makes Envoy read it again.
func TestCARotationChangesOnlyWhatTheSDSFileNames(t *testing.T) {
	mount := t.TempDir()
	tls := &TLS{CAFile: filepath.Join(mount, CAKey), Token: true}
	render := func() map[string][]byte {
		return renderEnvoy(t, envoyVariant{"rotation", model.SotW, "scopeplane.system.svc:18000", tls})
	}
	// The kubelet's atomic writer: files in a timestamped directory,
	// ..data linking to it, each key linking through ..data.
	publish := func(gen string, files map[string][]byte, ca string) {
		dir := filepath.Join(mount, "..2026_12_05_"+gen)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for key, data := range files {
			if err := os.WriteFile(filepath.Join(dir, key), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, CAKey), []byte(ca), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Base(dir), filepath.Join(mount, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(mount, "..data_tmp"), filepath.Join(mount, "..data")); err != nil {
			t.Fatal(err)
		}
		for key := range files {
			link := filepath.Join(mount, key)
			if _, err := os.Lstat(link); err != nil {
				if err := os.Symlink(filepath.Join("..data", key), link); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := os.Lstat(filepath.Join(mount, CAKey)); err != nil {
			if err := os.Symlink(filepath.Join("..data", CAKey), filepath.Join(mount, CAKey)); err != nil {
				t.Fatal(err)
			}
		}
	}
	read := func(p string) []byte {
		t.Helper()
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	// trustedCA follows the bootstrap as Envoy does: the transport
	// socket's SDS file, then the file its secret names.
	trustedCA := func() (ca []byte, watched string) {
		b := parseEnvoy(t, read(filepath.Join(mount, EnvoyKey)))
		up := &tlsv3.UpstreamTlsContext{}
		if err := b.GetStaticResources().GetClusters()[0].GetTransportSocket().GetTypedConfig().UnmarshalTo(up); err != nil {
			t.Fatal(err)
		}
		src := up.GetCommonTlsContext().GetCombinedValidationContext().GetValidationContextSdsSecretConfig().GetSdsConfig().GetPathConfigSource()
		vc := parseSecret(t, read(src.GetPath())).GetValidationContext()
		return read(vc.GetTrustedCa().GetFilename()), vc.GetWatchedDirectory().GetPath()
	}

	before := render()
	publish("1", before, "CA one")
	if ca, _ := trustedCA(); string(ca) != "CA one" {
		t.Fatalf("Envoy would trust %q, want the first CA", ca)
	}
	_, watched := trustedCA()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	if err := w.Add(watched); err != nil {
		t.Fatal(err)
	}

	after := render()
	publish("2", after, "CA two")
	for key, data := range before {
		if !bytes.Equal(after[key], data) {
			t.Errorf("%s changed with the CA:\n%s\n---\n%s", key, data, after[key])
		}
		if !bytes.Equal(read(filepath.Join(mount, key)), data) {
			t.Errorf("the mounted %s changed with the CA", key)
		}
	}
	if ca, _ := trustedCA(); string(ca) != "CA two" {
		t.Errorf("after the swap Envoy would trust %q, want the second CA", ca)
	}
	// Envoy's watch of a watched_directory fires on a move into it.
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-w.Events:
			if path.Base(ev.Name) == "..data" && ev.Has(fsnotify.Create) {
				return
			}
		case err := <-w.Errors:
			t.Fatal(err)
		case <-deadline:
			t.Fatalf("no move into %s, the directory the CA secret watches", watched)
		}
	}
}
