package hostile

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/internal/envoyprobe"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// envoyFiles lays out, under a new directory, what an Envoy Pod of the
// default/sotw scope mounts with the chart's defaults: the bootstrap
// ConfigMap's files for a server at addr (TLS, token auth) and the
// projected token holding token. The directory is the root the files'
// absolute paths are read under.
func envoyFiles(t *testing.T, addr, caPEM, token string) string {
	t.Helper()
	tlsOpts := &bootstrap.TLS{CAFile: bootstrap.MountPath + "/" + bootstrap.CAKey, Token: true}
	y, err := bootstrap.Envoy(model.Key{Namespace: "default", Name: "sotw"}, model.SotW, addr, tlsOpts)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := bootstrap.EnvoyCASDS(tlsOpts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := bootstrap.EnvoyTokenSDS(tlsOpts)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for path, data := range map[string]string{
		bootstrap.MountPath + "/" + bootstrap.EnvoyKey:    string(y),
		bootstrap.MountPath + "/" + bootstrap.CASDSKey:    string(ca),
		bootstrap.MountPath + "/" + bootstrap.TokenSDSKey: string(tok),
		bootstrap.MountPath + "/" + bootstrap.CAKey:       caPEM,
		bootstrap.TokenPath:                               token,
	} {
		writeFile(t, filepath.Join(root, path), data)
	}
	return root
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// injectedHeader is the header Envoy's credential injector adds to every
// request of the xDS cluster, as the rendered bootstrap configures it and
// envoyprobe reads it: the Generic credential's header with its
// header_value_prefix before the token file's content.
func injectedHeader(t *testing.T, token string) hpack.HeaderField {
	t.Helper()
	root := envoyFiles(t, "127.0.0.1:18000", "", token)
	b, err := envoyprobe.Load(bootstrap.MountPath+"/"+bootstrap.EnvoyKey, envoyprobe.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	name, value, ok, err := b.Header()
	if err != nil || !ok {
		t.Fatalf("the rendered Envoy bootstrap injects no header (%v)", err)
	}
	return hpack.HeaderField{Name: name, Value: value, Sensitive: true}
}

// envoyStream opens, from the loopback address from, one ADS stream the
// way Envoy's own gRPC client does over TLS (HTTP/2, :authority the xDS
// cluster's name, the injected header), sends a cluster request of the
// scope's Envoy and returns the first response, or the gRPC status the
// server ended the stream with.
func envoyStream(t *testing.T, tp *tplane, from string, injected hpack.HeaderField) (*discoveryv3.DiscoveryResponse, codes.Code, string) {
	t.Helper()
	raw := rawFrom(t, from, tp.addr)
	defer func() { _ = raw.Close() }()
	_ = raw.SetDeadline(time.Now().Add(testkit.Timeout))
	cfg := tp.tls.Clone()
	cfg.NextProtos = []string{"h2"}
	cfg.ServerName = "127.0.0.1" // the server certificate's IP SAN, as the bootstrap's SAN match checks it
	c := tls.Client(raw, cfg)
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
		{Name: ":path", Value: "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"},
		{Name: ":authority", Value: bootstrap.XDSClusterName},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		injected,
	} {
		_ = enc.WriteField(f)
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	req, err := proto.Marshal(&discoveryv3.DiscoveryRequest{Node: testkit.Node("envoy-7f9", "default/sotw"), TypeUrl: xdstype.Cluster.URL()})
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 5+len(req))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(req)))
	copy(msg[5:], req)
	if err := fr.WriteData(1, false, msg); err != nil {
		t.Fatal(err)
	}
	var body []byte
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) {
				t.Fatal("the server closed the connection")
			}
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("the stream was reset: %v", f.ErrCode)
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		case *http2.MetaHeadersFrame:
			if s := f.PseudoValue("status"); s != "" && s != "200" {
				t.Fatalf("HTTP status %s", s)
			}
			if v := field(f, "grpc-status"); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("grpc-status %q", v)
				}
				return nil, codes.Code(n), field(f, "grpc-message")
			}
		case *http2.DataFrame:
			body = append(body, f.Data()...)
			if n := len(f.Data()); n > 0 {
				_ = fr.WriteWindowUpdate(0, uint32(n))
				_ = fr.WriteWindowUpdate(1, uint32(n))
			}
			if len(body) >= 5 && len(body) >= 5+int(binary.BigEndian.Uint32(body[1:5])) {
				resp := &discoveryv3.DiscoveryResponse{}
				if err := proto.Unmarshal(body[5:5+binary.BigEndian.Uint32(body[1:5])], resp); err != nil {
					t.Fatal(err)
				}
				return resp, codes.OK, ""
			}
		}
	}
}

// TestEnvoyInjectedToken sends the projected token the way the rendered
// Envoy bootstrap makes Envoy send it (the credential injector's header on
// the ADS stream's HTTP/2 request, over TLS) and checks that the server
// admits a valid token and refuses a forged one, an expired one and an
// empty token file (the injector's prefix alone) with Unauthenticated,
// while a legitimate proxy keeps converging. No Envoy binary is run: the
// wire request stands in for Envoy's gRPC client.
func TestEnvoyInjectedToken(t *testing.T) {
	cert, roots := selfSignedCert(t)
	tp := startTransport(t, server.Options{},
		&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	now := time.Now()
	resp, code, msg := envoyStream(t, tp, legitimate, injectedHeader(t, tp.token))
	if code != codes.OK || len(resp.GetResources()) < services {
		t.Fatalf("a valid injected token: %s %q, %d clusters; want admitted with every cluster", code, msg, len(resp.GetResources()))
	}
	forger := authtest.NewIssuer(t, "k1") // the issuer's key id, another key
	for _, r := range []struct{ name, token, says string }{
		{"forged token", forger.Sign(authtest.SAClaims("default", "envoy", "scopeplane", now.Add(-time.Minute), now.Add(time.Hour))), "token"},
		{"expired token", tp.iss.Sign(authtest.SAClaims("default", "envoy", "scopeplane", now.Add(-2*time.Hour), now.Add(-time.Hour))), "expired"},
		{"token for another audience", tp.iss.Sign(authtest.SAClaims("default", "envoy", "kubernetes", now.Add(-time.Minute), now.Add(time.Hour))), "audience"},
		{"empty token file", "", "Bearer <token>"},
	} {
		t.Run(r.name, func(t *testing.T) {
			before := heap()
			_, code, msg := envoyStream(t, tp, attacker, injectedHeader(t, r.token))
			if code != codes.Unauthenticated || !strings.Contains(msg, r.says) {
				t.Errorf("ended %s %q, want Unauthenticated saying %q", code, msg, r.says)
			}
			tp.during("Envoy's injected header: "+r.name, fmt.Sprintf("%s: %.80s", code, msg), before)
		})
	}
}

// TestEnvoyProbeJoins runs envoyprobe, which reads a bootstrap as Envoy
// does, on the files an Envoy Pod mounts with the chart's defaults: it
// joins over TLS (the CA through its SDS file, the server's SAN checked)
// with the token the injector sends, and holds the scope's clusters. A
// token file replaced by a forged token is read again on the next stream,
// which the server refuses; the real token back, the next stream joins.
func TestEnvoyProbeJoins(t *testing.T) {
	cert, roots := selfSignedCert(t)
	tp := startTransport(t, server.Options{},
		&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}))
	root := envoyFiles(t, tp.addr, caPEM, tp.token)
	b, err := envoyprobe.Load(bootstrap.MountPath+"/"+bootstrap.EnvoyKey, envoyprobe.Options{Root: root, ServiceNode: "envoy-7f9"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Protocol != adsclient.SotW || b.Node.GetId() != "envoy-7f9" || b.Address != tp.addr {
		t.Fatalf("the probe read protocol %s, node %q, server %s from the bootstrap", b.Protocol, b.Node.GetId(), b.Address)
	}
	// join runs one stream of a new client until it holds every cluster
	// (nil) or ends (its error).
	join := func() error {
		c := adsclient.New(testkit.WildcardClient(adsclient.SotW, b.Node))
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
		defer cancel()
		done, held := make(chan error, 1), make(chan error, 1)
		go func() { done <- b.Run(ctx, c) }()
		go func() {
			held <- c.WaitFor(ctx, func(c *adsclient.Client) bool { return len(c.State(xdstype.Cluster.URL())) >= services })
		}()
		select {
		case err := <-held:
			cancel()
			if end := <-done; status.Code(end) != codes.Canceled {
				return fmt.Errorf("the stream ended %w when cancelled", end)
			}
			return err
		case err := <-done:
			return fmt.Errorf("the stream ended before it held the clusters: %w", err)
		}
	}
	if err := join(); err != nil {
		t.Fatalf("the probe did not join with the default bootstrap: %v", err)
	}
	now := time.Now()
	forged := authtest.NewIssuer(t, "k1").Sign(authtest.SAClaims("default", "envoy", "scopeplane", now.Add(-time.Minute), now.Add(time.Hour)))
	writeFile(t, filepath.Join(root, bootstrap.TokenPath), forged)
	if err := join(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the stream after the token file held a forged token ended %v, want Unauthenticated", err)
	}
	writeFile(t, filepath.Join(root, bootstrap.TokenPath), tp.token)
	if err := join(); err != nil {
		t.Fatalf("the stream after the token came back: %v", err)
	}
	// The bootstrap matches the server's host as it names it: a server
	// reached as localhost, whose certificate names 127.0.0.1 only, is not
	// trusted, whatever CA signed it.
	_, port, _ := net.SplitHostPort(tp.addr)
	elsewhere := envoyFiles(t, "localhost:"+port, caPEM, tp.token)
	b, err = envoyprobe.Load(bootstrap.MountPath+"/"+bootstrap.EnvoyKey, envoyprobe.Options{Root: elsewhere})
	if err != nil {
		t.Fatal(err)
	}
	if err := join(); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a server whose certificate does not name the bootstrap's host: %v, want a certificate error", err)
	}
}

// field is the value of the regular header field name in f, or "".
func field(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}
