package xdstls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/metrics"
)

// issue returns Secret data with a fresh CA and a serving certificate for
// 127.0.0.1.
func issue(t *testing.T, now time.Time) map[string][]byte {
	t.Helper()
	s := &SelfSigned{IPs: []net.IP{net.ParseIP("127.0.0.1")}, Now: func() time.Time { return now }}
	data, _, err := s.renew(nil)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// writeSecretDir lays data out as the kubelet does in a Secret volume:
// files in a timestamped directory, reached through the ..data symlink,
// which is swapped atomically (rename) on every update.
func writeSecretDir(t *testing.T, dir string, gen int, data map[string][]byte) {
	t.Helper()
	ts := filepath.Join(dir, "..gen"+strconv.Itoa(gen))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(ts, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{CertFile, KeyFile, CAFile} {
		if _, err := os.Lstat(filepath.Join(dir, k)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func clientCreds(t *testing.T, ca []byte) credentials.TransportCredentials {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("no CA")
	}
	return credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
}

// servedCert is the serving certificate a new connection with creds gets
// and the TLS version negotiated, after one unary call.
func servedCert(t *testing.T, addr string, creds credentials.TransportCredentials) (*x509.Certificate, uint16, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return nil, 0, err
	}
	info := p.AuthInfo.(credentials.TLSInfo)
	return info.State.PeerCertificates[0], info.State.Version, nil
}

// TestRotatedFilesReachNewHandshakesAndKeepStreams serves gRPC with the
// watched directory's certificate, replaces the files the way a Secret
// volume does, and checks that a stream opened before stays up while a new
// connection gets the new certificate; a plaintext client is refused.
func TestRotatedFilesReachNewHandshakesAndKeepStreams(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	first := issue(t, now)
	writeSecretDir(t, dir, 1, first)
	certs := NewCertificates()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := make(chan error, 1)
	go func() { watched <- WatchDir(ctx, dir, certs, logr.Discard()) }()
	testkit.Eventually(t, "the first certificate loaded", func() (bool, string) {
		err := certs.Loaded()
		return err == nil, ""
	})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(certs.ServerConfig())))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	addr := lis.Addr().String()

	cert, version, err := servedCert(t, addr, clientCreds(t, first[CAFile]))
	if err != nil {
		t.Fatal(err)
	}
	if version != tls.VersionTLS13 {
		t.Errorf("negotiated TLS version %x, want TLS 1.3", version)
	}
	firstSerial := cert.SerialNumber

	// A long-lived stream on a connection made with the first certificate.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(clientCreds(t, first[CAFile])))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}

	second := issue(t, now)
	writeSecretDir(t, dir, 2, second)
	testkit.Eventually(t, "a new connection served the new certificate", func() (bool, string) {
		cert, _, err := servedCert(t, addr, clientCreds(t, second[CAFile]))
		return err == nil && cert.SerialNumber.Cmp(firstSerial) != 0, ""
	})
	if _, _, err := servedCert(t, addr, clientCreds(t, first[CAFile])); err == nil {
		t.Error("a client trusting only the old CA still verified a new connection")
	}
	// The stream opened before the rotation is still served.
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("the stream opened before the rotation: %v, %v", resp, err)
	}

	// Half-written files are ignored; the certificate stays.
	if err := os.WriteFile(filepath.Join(dir, "..gen2", KeyFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := LoadDir(dir, NewCertificates()); err == nil {
		t.Error("a key that does not parse loaded")
	}
	if err := certs.Loaded(); err != nil {
		t.Error(err)
	}

	if _, _, err := servedCert(t, addr, insecure.NewCredentials()); err == nil {
		t.Error("a plaintext client got an answer from the TLS server")
	}
	cancel()
	if err := <-watched; err != nil {
		t.Error(err)
	}
}

// TestSelfSignedRotation walks the self-managed CA through its lifetimes
// with a fake clock.
func TestSelfSignedRotation(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	s := &SelfSigned{DNSNames: []string{"scopeplane", "scopeplane.sys", "scopeplane.sys.svc", "scopeplane.sys.svc.cluster.local"}, Now: func() time.Time { return now }}
	data, changed, err := s.renew(nil)
	if err != nil || !changed {
		t.Fatal(changed, err)
	}
	check := func(data map[string][]byte, cas int) (*x509.Certificate, []*x509.Certificate) {
		t.Helper()
		c := NewCertificates()
		c.now = func() time.Time { return now }
		if err := c.Set(data[CertFile], data[KeyFile], data[CAFile]); err != nil {
			t.Fatalf("at +%v: %v", now.Sub(start), err)
		}
		bundle := parseCerts(data[CAFile])
		if len(bundle) != cas {
			t.Fatalf("at +%v: %d CAs in the bundle, want %d", now.Sub(start), len(bundle), cas)
		}
		return parseCerts(data[CertFile])[0], bundle
	}
	leaf, bundle := check(data, 1)
	oldCA := bundle[0]

	// Nothing is due early on.
	now = start.Add(10 * 24 * time.Hour)
	if _, changed, err := s.renew(data); err != nil || changed {
		t.Fatalf("renewed at day 10: %v %v", changed, err)
	}
	// The serving certificate renews at two thirds of its life.
	now = start.Add(21 * 24 * time.Hour)
	data, changed, err = s.renew(data)
	if err != nil || !changed {
		t.Fatal(changed, err)
	}
	if l, _ := check(data, 1); l.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
		t.Fatal("the serving certificate was not renewed")
	}
	// At two thirds of the CA's life a new CA joins the bundle; the old one
	// signs this last serving certificate.
	now = twoThirds(oldCA).Add(time.Hour)
	data, _, err = s.renew(data)
	if err != nil {
		t.Fatal(err)
	}
	leaf, bundle = check(data, 2)
	if string(leaf.RawIssuer) != string(oldCA.RawSubject) {
		t.Error("the serving certificate issued at the CA rotation is not the outgoing CA's")
	}
	newCA := bundle[1]
	// The next renewal is the new CA's.
	now = now.Add(21 * 24 * time.Hour)
	data, _, err = s.renew(data)
	if err != nil {
		t.Fatal(err)
	}
	if leaf, _ = check(data, 2); string(leaf.RawIssuer) != string(newCA.RawSubject) {
		t.Error("the serving certificate after the CA rotation is not the new CA's")
	}
	// The old CA leaves the bundle when it expires.
	now = oldCA.NotAfter.Add(time.Hour)
	data, _, err = s.renew(data)
	if err != nil {
		t.Fatal(err)
	}
	check(data, 1)
	// Other names renew the serving certificate at once.
	s.DNSNames = []string{"xds.example.com"}
	data, changed, err = s.renew(data)
	if err != nil || !changed {
		t.Fatal(changed, err)
	}
	if leaf, _ = check(data, 1); leaf.DNSNames[0] != "xds.example.com" {
		t.Errorf("names %v", leaf.DNSNames)
	}
}

func TestServingNames(t *testing.T) {
	for addr, want := range map[string]string{
		"scopeplane.sys.svc:18000":               "[scopeplane scopeplane.sys scopeplane.sys.svc scopeplane.sys.svc.cluster.local] []",
		"scopeplane.sys.svc.cluster.local:18000": "[scopeplane scopeplane.sys scopeplane.sys.svc scopeplane.sys.svc.cluster.local] []",
		"xds.example.com:443":                    "[xds.example.com] []",
		"127.0.0.1:18000":                        "[] [127.0.0.1]",
	} {
		dns, ips, err := ServingNames(addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmtNames(dns, ips); got != want {
			t.Errorf("%s: %s, want %s", addr, got, want)
		}
	}
	if _, _, err := ServingNames("no-port"); err == nil {
		t.Error("an address without a port was accepted")
	}
}

func fmtNames(dns []string, ips []net.IP) string {
	s := "["
	for i, d := range dns {
		if i > 0 {
			s += " "
		}
		s += d
	}
	s += "] ["
	for i, ip := range ips {
		if i > 0 {
			s += " "
		}
		s += ip.String()
	}
	return s + "]"
}

// TestCertificateExpiryMetric checks what scopeplane_xds_certificate_expiry_timestamp_seconds
// exports across a CA rotation: the serving certificate's expiry, and the
// expiry of the CA that verifies it, not of another CA of the bundle. While
// the outgoing CA still signs the serving certificate, its expiry is the one
// that matters; once the new CA signs, the old one's nearing end is no alarm.
func TestCertificateExpiryMetric(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	s := &SelfSigned{DNSNames: []string{"scopeplane"}, Now: func() time.Time { return now }}
	data, _, err := s.renew(nil)
	if err != nil {
		t.Fatal(err)
	}
	served := func() (serving, ca float64) {
		t.Helper()
		c := NewCertificates()
		c.now = func() time.Time { return now }
		if err := c.Set(data[CertFile], data[KeyFile], data[CAFile]); err != nil {
			t.Fatal(err)
		}
		return testutil.ToFloat64(metrics.CertificateExpiry.WithLabelValues(metrics.CertificateServing)),
			testutil.ToFloat64(metrics.CertificateExpiry.WithLabelValues(metrics.CertificateCA))
	}
	unix := func(c *x509.Certificate) float64 { return float64(c.NotAfter.Unix()) }

	serving, ca := served()
	leaf, oldCA := parseCerts(data[CertFile])[0], parseCerts(data[CAFile])[0]
	if serving != unix(leaf) || ca != unix(oldCA) {
		t.Fatalf("serving %v, ca %v; want %v and %v", serving, ca, unix(leaf), unix(oldCA))
	}
	// The new CA joins the bundle; the old one still signs.
	now = twoThirds(oldCA).Add(time.Hour)
	if data, _, err = s.renew(data); err != nil {
		t.Fatal(err)
	}
	bundle := parseCerts(data[CAFile])
	if len(bundle) != 2 {
		t.Fatalf("%d CAs in the bundle at the rotation, want 2", len(bundle))
	}
	if _, ca = served(); ca != unix(oldCA) {
		t.Errorf("while the outgoing CA signs, ca is %v, want its expiry %v (the new CA's is %v)", ca, unix(oldCA), unix(bundle[1]))
	}
	// The next renewal is the new CA's: its expiry is the one exported.
	now = now.Add(21 * 24 * time.Hour)
	if data, _, err = s.renew(data); err != nil {
		t.Fatal(err)
	}
	serving, ca = served()
	if leaf = parseCerts(data[CertFile])[0]; serving != unix(leaf) {
		t.Errorf("serving %v, want %v", serving, unix(leaf))
	}
	if ca != unix(bundle[1]) {
		t.Errorf("after the new CA signs, ca is %v, want its expiry %v (the old CA's is %v)", ca, unix(bundle[1]), unix(oldCA))
	}
}

// TestLeadersOfTwoShardCountsConverge renews one Secret's data in turn by
// two leaders that ask for different names, as the leaders of two shard
// counts do while the count changes: the second adds its names to the
// first's certificate, and after that neither issues again, where two
// leaders each issuing for its own names alone would take turns for as
// long as both lead. The names no leader asks for go at the next renewal.
func TestLeadersOfTwoShardCountsConverge(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	two := &SelfSigned{DNSNames: []string{"xds", "xds-shard-1"}, IPs: []net.IP{net.ParseIP("10.0.0.1")}, Now: clock}
	three := &SelfSigned{DNSNames: []string{"xds", "xds-shard-1", "xds-shard-2"}, IPs: []net.IP{net.ParseIP("10.0.0.2")}, Now: clock}
	data, _, err := two.renew(nil)
	if err != nil {
		t.Fatal(err)
	}
	data, changed, err := three.renew(data)
	if err != nil || !changed {
		t.Fatalf("the leader whose names the certificate lacks did not issue it again: %v %v", changed, err)
	}
	for range 3 {
		for _, s := range []*SelfSigned{two, three} {
			if data, changed, err = s.renew(data); err != nil || changed {
				t.Fatalf("leader of %v issued again: %v %v", s.DNSNames, changed, err)
			}
		}
	}
	leaf := parseCerts(data[CertFile])[0]
	if got := fmt.Sprint(leaf.DNSNames, leaf.IPAddresses); got != "[xds xds-shard-1 xds-shard-2] [10.0.0.2 10.0.0.1]" {
		t.Errorf("names %s", got)
	}
	now = twoThirds(leaf)
	if data, _, err = two.renew(data); err != nil {
		t.Fatal(err)
	}
	if leaf = parseCerts(data[CertFile])[0]; fmt.Sprint(leaf.DNSNames, leaf.IPAddresses) != "[xds xds-shard-1] [10.0.0.1]" {
		t.Errorf("after the renewal the names are %v %v, want only the renewing leader's", leaf.DNSNames, leaf.IPAddresses)
	}
}

// TestRotateTakesAnotherLeadersWrite checks that a leader whose write of
// the Secret conflicts with another shard's leader's reads it again and
// renews what is still due for its own names, keeping what the other
// wrote, rather than failing the rotation: with shards, every shard's
// leader rotates the one Secret. The other leader's write lands between
// this one's read and its update, as the API server would order them.
func TestRotateTakesAnotherLeadersWrite(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	key := types.NamespacedName{Namespace: "sys", Name: "xds-tls"}
	first := &SelfSigned{DNSNames: []string{"xds"}, Now: clock}
	data, _, err := first.renew(nil)
	if err != nil {
		t.Fatal(err)
	}
	// The other leader renews from nothing: a CA of its own.
	other := &SelfSigned{DNSNames: []string{"xds", "xds-shard-2"}, Now: clock}
	otherData, _, err := other.renew(nil)
	if err != nil {
		t.Fatal(err)
	}
	updates := 0
	c := fake.NewClientBuilder().WithObjects(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Data: data}).
		WithInterceptorFuncs(interceptor.Funcs{Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if updates++; updates == 1 {
				sec := &corev1.Secret{}
				if err := c.Get(ctx, key, sec); err != nil {
					return err
				}
				sec.Data = otherData
				if err := c.Update(ctx, sec); err != nil {
					return err
				}
			}
			return c.Update(ctx, obj, opts...)
		}}).Build()
	second := &SelfSigned{Reader: c, Writer: c, Secret: key, DNSNames: []string{"xds", "xds-shard-1"}, Now: clock}
	certs := NewCertificates()
	certs.now = clock
	if err := second.Rotate(context.Background(), certs); err != nil {
		t.Fatalf("the rotation failed on another leader's write: %v", err)
	}
	sec := &corev1.Secret{}
	if err := c.Get(context.Background(), key, sec); err != nil {
		t.Fatal(err)
	}
	leaf := parseCerts(sec.Data[CertFile])[0]
	if string(sec.Data[CAFile]) != string(otherData[CAFile]) || fmt.Sprint(leaf.DNSNames) != "[xds xds-shard-1 xds-shard-2]" {
		t.Errorf("after %d updates the Secret's CA is the other leader's: %v, and its certificate names %v, want the other leader's CA and [xds xds-shard-1 xds-shard-2]",
			updates, string(sec.Data[CAFile]) == string(otherData[CAFile]), leaf.DNSNames)
	}
}

// slotNames are the names a replica serves once sharding was turned on:
// the unsharded Service's and a slot's.
var slotNames = []string{"xds", "xds-slot-1"}

// runBeforeTheSlots runs, with an hour between refreshes and leading as
// leading says, a replica that asks for slotNames over a Secret whose
// certificate names only "xds", until the test ends; it returns the
// Secret's client and key, and what the replica serves once it loaded it.
func runBeforeTheSlots(t *testing.T, leading func() bool) (client.Client, types.NamespacedName, *Certificates) {
	t.Helper()
	key := types.NamespacedName{Namespace: "sys", Name: "xds-tls"}
	data, _, err := (&SelfSigned{DNSNames: []string{"xds"}}).renew(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithObjects(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Data: data}).Build()
	s := &SelfSigned{Reader: c, Writer: c, Secret: key, DNSNames: slotNames}
	certs := NewCertificates()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, certs, leading, time.Hour, logr.Discard()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	testkit.Eventually(t, "the replica loaded the certificate", func() (bool, string) {
		return certs.CABundle() != nil, "no CA bundle yet"
	})
	return c, key, certs
}

// TestANewLeaderIssuesAtOnce runs a replica that loads the Secret as a
// follower and then becomes the leader, with an hour between refreshes: it
// issues the certificate again for the name it lacks (a slot's, as when
// sharding is turned on) as soon as it leads, not at its next refresh.
func TestANewLeaderIssuesAtOnce(t *testing.T) {
	var leads atomic.Bool
	c, key, certs := runBeforeTheSlots(t, leads.Load)
	names := func() string {
		sec := &corev1.Secret{}
		if err := c.Get(context.Background(), key, sec); err != nil {
			return err.Error()
		}
		return fmt.Sprint(parseCerts(sec.Data[CertFile])[0].DNSNames)
	}
	if got := names(); got != "[xds]" {
		t.Fatalf("a follower issued the certificate: %s", got)
	}
	leads.Store(true)
	testkit.Eventually(t, "the new leader issued the certificate for the slot's name, and serves it", func() (bool, string) {
		got := names()
		return got == "[xds xds-slot-1]" && certs.Names(slotNames, nil), got
	})
}

// TestAFollowerServesTheSlotsNamesSoon runs a follower, with an hour
// between refreshes, whose certificate lacks a name its flags ask for (a
// slot's, sharding just turned on): once a leader writes a certificate
// that names it, the follower serves it within seconds, not at its next
// refresh.
func TestAFollowerServesTheSlotsNamesSoon(t *testing.T) {
	c, key, certs := runBeforeTheSlots(t, func() bool { return false })
	if certs.Names(slotNames, nil) {
		t.Fatal("the certificate names the slot before any leader issued it")
	}
	leader := &SelfSigned{Reader: c, Writer: c, Secret: key, DNSNames: slotNames}
	if err := leader.Rotate(context.Background(), NewCertificates()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the follower serves the certificate that names the slot", func() (bool, string) {
		return certs.Names(slotNames, nil), "not yet"
	})
}
