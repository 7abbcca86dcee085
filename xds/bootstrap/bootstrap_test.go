package bootstrap

import (
	"encoding/json"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc/xds"

	"github.com/scopeplane/scopeplane/xds/model"
)

var scope = model.Key{Namespace: "shop", Name: "gw"}

func TestEnvoyBootstrapMatchesTheScopeProtocol(t *testing.T) {
	for _, tc := range []struct {
		protocol model.Protocol
		server   string
		want     corev3.ApiConfigSource_ApiType
		static   bool
	}{
		{model.SotW, "scopeplane.system.svc:18000", corev3.ApiConfigSource_GRPC, false},
		{model.Delta, "10.0.0.7:18000", corev3.ApiConfigSource_DELTA_GRPC, true},
	} {
		out, err := Envoy(scope, tc.protocol, tc.server, nil)
		if err != nil {
			t.Fatal(err)
		}
		b := parseEnvoy(t, out)
		if err := b.ValidateAll(); err != nil {
			t.Errorf("invalid Envoy bootstrap: %v", err)
		}
		if got := b.GetDynamicResources().GetAdsConfig().GetApiType(); got != tc.want {
			t.Errorf("%s scope: api_type %v, want %v", tc.protocol, got, tc.want)
		}
		if got := b.GetNode().GetMetadata().GetFields()["scopeplane.dev/scope"].GetStringValue(); got != "shop/gw" {
			t.Errorf("node metadata names scope %q", got)
		}
		c := b.GetStaticResources().GetClusters()[0]
		if (c.GetType().String() == "STATIC") != tc.static || c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"] == nil {
			t.Errorf("xDS cluster %v: want static=%v and HTTP/2", c.GetType(), tc.static)
		}
		if a := b.GetAdmin().GetAddress().GetSocketAddress().GetAddress(); a != "127.0.0.1" {
			t.Errorf("admin listens on %q, want localhost only", a)
		}
	}
}

func TestGRPCBootstrapIsAcceptedByGRPC(t *testing.T) {
	out, err := GRPC(scope, "scopeplane.system.svc:18000", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xds.NewXDSResolverWithConfigForTesting(out); err != nil {
		t.Errorf("grpc-go refuses the bootstrap: %v\n%s", err, out)
	}
	var parsed struct {
		Node struct {
			Metadata map[string]string `json:"metadata"`
			Locality map[string]any    `json:"locality"`
		} `json:"node"`
	}
	if err := json.Unmarshal(out, &parsed); err != nil || parsed.Node.Metadata["scopeplane.dev/scope"] != "shop/gw" {
		t.Errorf("node metadata: %v %v", parsed.Node.Metadata, err)
	}
	// grpc-js-xds refuses a node without a locality object, even an empty one.
	if parsed.Node.Locality == nil {
		t.Errorf("node has no locality object; grpc-js-xds refuses it:\n%s", out)
	}
}

func TestBadServerAddressIsAnError(t *testing.T) {
	for _, addr := range []string{"", "no-port", "host:0", ":18000", "host:99999"} {
		if _, err := Envoy(scope, model.SotW, addr, nil); err == nil || !strings.Contains(err.Error(), "xDS server address") {
			t.Errorf("Envoy(%q): %v", addr, err)
		}
		if _, err := GRPC(scope, addr, nil); err == nil {
			t.Errorf("GRPC(%q) accepted", addr)
		}
	}
}

func TestBootstrapsUseTLSWithTheCAFile(t *testing.T) {
	tls := &TLS{CAFile: "/etc/scopeplane/xds/ca.crt"}
	out, err := GRPC(scope, "scopeplane.system.svc:18000", tls)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xds.NewXDSResolverWithConfigForTesting(out); err != nil {
		t.Errorf("grpc-go refuses the TLS bootstrap: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"type": "tls"`) || !strings.Contains(string(out), `"ca_certificate_file": "/etc/scopeplane/xds/ca.crt"`) {
		t.Errorf("the gRPC bootstrap does not use TLS channel credentials with the CA file:\n%s", out)
	}
	for _, server := range []string{"scopeplane.system.svc:18000", "10.0.0.7:18000"} {
		y, err := Envoy(scope, model.SotW, server, tls)
		if err != nil {
			t.Fatal(err)
		}
		b := parseEnvoy(t, y)
		ts := b.GetStaticResources().GetClusters()[0].GetTransportSocket()
		up := &tlsv3.UpstreamTlsContext{}
		if err := ts.GetTypedConfig().UnmarshalTo(up); err != nil {
			t.Fatalf("the xDS cluster has no TLS transport socket: %v\n%s", err, y)
		}
		host := strings.Split(server, ":")[0]
		// The CA itself comes through the SDS file CASDSKey (envoy_test.go).
		combined := up.GetCommonTlsContext().GetCombinedValidationContext()
		vc := combined.GetDefaultValidationContext()
		if up.GetSni() != host || combined.GetValidationContextSdsSecretConfig().GetSdsConfig().GetPathConfigSource().GetPath() != "/etc/scopeplane/xds/"+CASDSKey ||
			vc.GetMatchTypedSubjectAltNames()[0].GetMatcher().GetExact() != host {
			t.Errorf("%s: want SNI and SAN %s and the CA through %s:\n%s", server, host, CASDSKey, y)
		}
	}
}

// TestBootstrapsPresentTheCredentialsTheServerAccepts checks what each
// bootstrap presents: gRPC the token (call_creds) when tokens are accepted,
// else the SPIFFE certificate files; Envoy, which cannot send a rotating
// token, the SPIFFE certificate through the ConfigMap's SDS file, which
// names the certificate files and the directory Envoy watches for their
// rotation.
func TestBootstrapsPresentTheCredentialsTheServerAccepts(t *testing.T) {
	const ca = "/etc/scopeplane/xds/ca.crt"
	for _, c := range []struct {
		name                string
		tls                 TLS
		wantToken, wantCert bool
	}{
		{"tokens", TLS{CAFile: ca, Token: true}, true, false},
		{"SPIFFE", TLS{CAFile: ca, SPIFFEDir: SPIFFEDir}, false, true},
		{"both", TLS{CAFile: ca, Token: true, SPIFFEDir: SPIFFEDir}, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := GRPC(scope, "scopeplane.system.svc:18000", &c.tls)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := xds.NewXDSResolverWithConfigForTesting(g); err != nil {
				t.Errorf("grpc-go refuses the bootstrap: %v\n%s", err, g)
			}
			if got := strings.Contains(string(g), `"jwt_token_file": "`+TokenPath+`"`); got != c.wantToken {
				t.Errorf("gRPC sends the token: %v, want %v\n%s", got, c.wantToken, g)
			}
			if got := strings.Contains(string(g), `"certificate_file": "`+SPIFFEDir+`/tls.crt"`) && strings.Contains(string(g), `"private_key_file": "`+SPIFFEDir+`/tls.key"`); got != c.wantCert {
				t.Errorf("gRPC presents the SPIFFE certificate: %v, want %v\n%s", got, c.wantCert, g)
			}

			y, err := Envoy(scope, model.SotW, "scopeplane.system.svc:18000", &c.tls)
			if err != nil {
				t.Fatal(err)
			}
			b := parseEnvoy(t, y)
			up := &tlsv3.UpstreamTlsContext{}
			if err := b.GetStaticResources().GetClusters()[0].GetTransportSocket().GetTypedConfig().UnmarshalTo(up); err != nil {
				t.Fatal(err)
			}
			sdsConfigs := up.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs()
			sds, err := EnvoySDS(&c.tls)
			if err != nil {
				t.Fatal(err)
			}
			if c.tls.SPIFFEDir == "" {
				if len(sdsConfigs) != 0 || sds != nil {
					t.Fatalf("Envoy presents a certificate the server does not accept:\n%s\n%s", y, sds)
				}
				return
			}
			if len(sdsConfigs) != 1 {
				t.Fatalf("Envoy presents %d certificates, want the SPIFFE one:\n%s", len(sdsConfigs), y)
			}
			src := sdsConfigs[0].GetSdsConfig().GetPathConfigSource()
			if src.GetPath() != "/etc/scopeplane/xds/"+SDSKey || src.GetWatchedDirectory().GetPath() != "/etc/scopeplane/xds" {
				t.Errorf("Envoy reads its certificate from %q watching %q, want the ConfigMap's %s:\n%s", src.GetPath(), src.GetWatchedDirectory().GetPath(), SDSKey, y)
			}
			secret := parseSecret(t, sds)
			cert := secret.GetTlsCertificate()
			if secret.GetName() != sdsConfigs[0].GetName() || cert.GetCertificateChain().GetFilename() != SPIFFEDir+"/tls.crt" ||
				cert.GetPrivateKey().GetFilename() != SPIFFEDir+"/tls.key" || cert.GetWatchedDirectory().GetPath() != SPIFFEDir {
				t.Errorf("the SDS secret does not name the SPIFFE files and their directory:\n%s", sds)
			}
		})
	}
}
