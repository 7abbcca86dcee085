// Package envoyprobe joins a scope the way an Envoy started with the
// scope's bootstrap would: it reads envoy.yaml as Envoy does (strictly,
// every typed config checked), then the file-based SDS resources it names,
// dials the xDS cluster's endpoint with the TLS the bootstrap configures
// (SNI, the subject alternative name it matches, the CA and client
// certificate its SDS files point at), sends the header the xDS cluster's
// credential injector would add, and speaks the bootstrap's api_type with
// the node it declares. Every file is read again for every stream, as Envoy
// follows them when they change.
//
// It exists because no Envoy binary runs where scopeplane is built and
// tested: `make e2e` runs it in a Pod that mounts what the quickstart's
// Envoy Pod mounts, so the bootstrap's paths, secret names, credential and
// server name are exercised on a real node, and a user can run it
// (scopeplane-demo envoy-probe) to tell a bootstrap problem from an Envoy
// one.
package envoyprobe

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	credentialinjectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/credential_injector/v3"
	genericv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/injected_credentials/generic/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
)

// Options are what Envoy takes from its command line rather than from the
// bootstrap.
type Options struct {
	// ServiceNode and ServiceCluster are Envoy's --service-node and
	// --service-cluster: when set they replace the bootstrap's node id and
	// cluster, as they do for Envoy.
	ServiceNode, ServiceCluster string
	// Root, when set, is put before every absolute path the bootstrap and
	// its SDS files name, so that a bootstrap made for a Pod's mounts can
	// be read from elsewhere (a test's directory). Envoy has no such thing.
	Root string
}

// Status is what scopeplane-demo envoy-probe serves as JSON on /status,
// and what the e2e test reads there.
type Status struct {
	// Streams counts the streams opened.
	Streams int `json:"streams"`
	// Synced is true while a stream is open and the probe holds what
	// Envoy waits for before it is initialized: an answer for clusters and
	// listeners, and for endpoints and routes when it holds a cluster or a
	// listener. Like Envoy, it keeps what it holds across streams: a server
	// may answer a reconnect that claims the current versions with nothing.
	Synced    bool   `json:"synced"`
	LastError string `json:"lastError,omitempty"`
	// Held is how many resources of each type the probe holds.
	Held map[string]int `json:"held"`
	// Endpoints are the addresses of each ClusterLoadAssignment held.
	Endpoints map[string][]string `json:"endpoints"`
	// Routes are, for each virtual host held (inline in a route
	// configuration, or by VHDS), where each of its routes sends requests,
	// in order: "cluster", or "cluster=weight" for each cluster of a
	// weighted split joined by spaces, or "status N" for a direct response.
	Routes map[string][]string `json:"routes"`
	NACKs  int                 `json:"nacks"`
}

// Bootstrap is what a probe takes from an Envoy bootstrap.
type Bootstrap struct {
	// Protocol is ads_config's api_type.
	Protocol adsclient.Protocol
	// Node is the bootstrap's node with Options applied.
	Node *corev3.Node
	// Cluster is the name of the static cluster ads_config names.
	Cluster string
	// Address is that cluster's first endpoint, host:port.
	Address string

	root       string
	tls        *tlsv3.UpstreamTlsContext
	credential *genericv3.Generic
}

// Load reads and checks the bootstrap at path as Envoy would at start: an
// error names what Envoy would refuse, or what the probe cannot follow.
func Load(path string, o Options) (*Bootstrap, error) {
	raw, err := os.ReadFile(o.at(path))
	if err != nil {
		return nil, err
	}
	if err := bootstrap.ValidateEnvoy(raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := unmarshal(raw, b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p := &Bootstrap{Node: b.GetNode(), root: o.Root}
	if p.Node == nil {
		p.Node = &corev3.Node{}
	}
	if o.ServiceNode != "" {
		p.Node.Id = o.ServiceNode
	}
	if o.ServiceCluster != "" {
		p.Node.Cluster = o.ServiceCluster
	}
	ads := b.GetDynamicResources().GetAdsConfig()
	switch ads.GetApiType() {
	case corev3.ApiConfigSource_GRPC:
		p.Protocol = adsclient.SotW
	case corev3.ApiConfigSource_DELTA_GRPC:
		p.Protocol = adsclient.Delta
	default:
		return nil, fmt.Errorf("%s: ads_config.api_type %s is neither GRPC nor DELTA_GRPC", path, ads.GetApiType())
	}
	if len(ads.GetGrpcServices()) != 1 || ads.GetGrpcServices()[0].GetEnvoyGrpc() == nil {
		return nil, fmt.Errorf("%s: ads_config needs exactly one envoy_grpc service", path)
	}
	p.Cluster = ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	i := slices.IndexFunc(b.GetStaticResources().GetClusters(), func(c *clusterv3.Cluster) bool { return c.GetName() == p.Cluster })
	if i < 0 {
		return nil, fmt.Errorf("%s: ads_config names the cluster %q, which static_resources does not define", path, p.Cluster)
	}
	cluster := b.GetStaticResources().GetClusters()[i]
	for _, l := range cluster.GetLoadAssignment().GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			if sa := e.GetEndpoint().GetAddress().GetSocketAddress(); sa != nil && p.Address == "" {
				p.Address = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
			}
		}
	}
	if p.Address == "" {
		return nil, fmt.Errorf("%s: the cluster %q has no socket address", path, p.Cluster)
	}
	if ts := cluster.GetTransportSocket(); ts != nil {
		p.tls = &tlsv3.UpstreamTlsContext{}
		if err := ts.GetTypedConfig().UnmarshalTo(p.tls); err != nil {
			return nil, fmt.Errorf("%s: the cluster %q's transport socket is not an UpstreamTlsContext: %w", path, p.Cluster, err)
		}
	}
	if opts, ok := cluster.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; ok {
		h := &upstreamhttpv3.HttpProtocolOptions{}
		if err := opts.UnmarshalTo(h); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, f := range h.GetHttpFilters() {
			inj := &credentialinjectorv3.CredentialInjector{}
			if f.GetTypedConfig().UnmarshalTo(inj) != nil {
				continue
			}
			p.credential = &genericv3.Generic{}
			if err := inj.GetCredential().GetTypedConfig().UnmarshalTo(p.credential); err != nil {
				return nil, fmt.Errorf("%s: the credential injector's credential is not generic: %w", path, err)
			}
		}
	}
	return p, nil
}

// Header is the header the xDS cluster's credential injector adds to the
// ADS stream, read from the files it names now; ok is false when the
// bootstrap injects none.
func (p *Bootstrap) Header() (name, value string, ok bool, err error) {
	if p.credential == nil {
		return "", "", false, nil
	}
	secret, err := p.secret(p.credential.GetCredential())
	if err != nil {
		return "", "", false, fmt.Errorf("the credential injector's secret: %w", err)
	}
	token, err := p.data(secret.GetGenericSecret().GetSecret())
	if err != nil {
		return "", "", false, fmt.Errorf("the credential injector's secret %q: %w", secret.GetName(), err)
	}
	name = strings.ToLower(p.credential.GetHeader())
	if name == "" {
		name = "authorization"
	}
	// Envoy strips the line end a file-based secret often ends with.
	return name, p.credential.GetHeaderValuePrefix() + strings.TrimRight(string(token), "\r\n"), true, nil
}

// TLSConfig is the xDS cluster's TLS as Envoy applies it, with the CA and
// client certificate read now from the files its SDS resources name; nil
// for a plaintext cluster.
func (p *Bootstrap) TLSConfig() (*tls.Config, error) {
	if p.tls == nil {
		return nil, nil
	}
	common := p.tls.GetCommonTlsContext()
	combined := common.GetCombinedValidationContext()
	if combined == nil {
		return nil, errors.New("the probe follows a combined_validation_context only, which every scopeplane bootstrap has")
	}
	ca, err := p.secret(combined.GetValidationContextSdsSecretConfig())
	if err != nil {
		return nil, fmt.Errorf("the CA's secret: %w", err)
	}
	pem, err := p.data(ca.GetValidationContext().GetTrustedCa())
	if err != nil {
		return nil, fmt.Errorf("the CA's secret %q: %w", ca.GetName(), err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the CA's secret %q names a file with no PEM certificate", ca.GetName())
	}
	var sans []string
	for _, m := range combined.GetDefaultValidationContext().GetMatchTypedSubjectAltNames() {
		sans = append(sans, m.GetMatcher().GetExact())
	}
	c := &tls.Config{
		RootCAs: roots, ServerName: p.tls.GetSni(), NextProtos: common.GetAlpnProtocols(), MinVersion: tls.VersionTLS12,
		// Envoy checks the chain, then that one SAN equals a matcher's.
		VerifyConnection: func(cs tls.ConnectionState) error { return matchSAN(cs.PeerCertificates[0], sans) },
	}
	for _, sds := range common.GetTlsCertificateSdsSecretConfigs() {
		s, err := p.secret(sds)
		if err != nil {
			return nil, fmt.Errorf("the client certificate's secret: %w", err)
		}
		chain, err := p.data(s.GetTlsCertificate().GetCertificateChain())
		if err != nil {
			return nil, err
		}
		key, err := p.data(s.GetTlsCertificate().GetPrivateKey())
		if err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair(chain, key)
		if err != nil {
			return nil, fmt.Errorf("the client certificate's secret %q: %w", s.GetName(), err)
		}
		c.Certificates = append(c.Certificates, cert)
	}
	return c, nil
}

// matchSAN is Envoy's match_typed_subject_alt_names with exact matchers:
// some DNS name or IP address of the certificate equals one of sans.
func matchSAN(cert *x509.Certificate, sans []string) error {
	if len(sans) == 0 {
		return nil
	}
	got := slices.Clone(cert.DNSNames)
	for _, ip := range cert.IPAddresses {
		got = append(got, ip.String())
	}
	for _, s := range got {
		if slices.Contains(sans, s) {
			return nil
		}
	}
	return fmt.Errorf("the server's certificate names %v, none of the bootstrap's %v", got, sans)
}

// Run opens one ADS stream to the bootstrap's server for c, as Envoy
// would: the files read again, TLS (when configured) with the server name
// and ALPN of the bootstrap, the injected header. Envoy's :authority is the
// cluster's name, which gRPC's TLS would check against the certificate:
// the probe leaves it the server's host (the server reads neither). It
// returns what ended the stream.
func (p *Bootstrap) Run(ctx context.Context, c *adsclient.Client) error {
	conf, err := p.TLSConfig()
	if err != nil {
		return err
	}
	creds := insecure.NewCredentials()
	if conf != nil {
		creds = credentials.NewTLS(conf)
	}
	conn, err := grpc.NewClient(p.Address, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	name, value, ok, err := p.Header()
	if err != nil {
		return err
	}
	if ok {
		ctx = metadata.AppendToOutgoingContext(ctx, name, value)
	}
	return c.Run(ctx, conn)
}

// secret reads the one Secret of the file-based SDS resource sds names,
// checking its name as Envoy does.
func (p *Bootstrap) secret(sds *tlsv3.SdsSecretConfig) (*tlsv3.Secret, error) {
	file := sds.GetSdsConfig().GetPathConfigSource().GetPath()
	if file == "" {
		return nil, fmt.Errorf("secret %q is not read from a file (path_config_source)", sds.GetName())
	}
	raw, err := os.ReadFile(p.at(file))
	if err != nil {
		return nil, err
	}
	resp := &discoveryv3.DiscoveryResponse{}
	if err := unmarshal(raw, resp); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(resp.GetResources()) != 1 {
		return nil, fmt.Errorf("%s holds %d resources, Envoy takes exactly one", file, len(resp.GetResources()))
	}
	s := &tlsv3.Secret{}
	if err := resp.GetResources()[0].UnmarshalTo(s); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if s.GetName() != sds.GetName() {
		return nil, fmt.Errorf("%s holds the secret %q, the bootstrap expects %q", file, s.GetName(), sds.GetName())
	}
	return s, nil
}

// data reads a DataSource; a file is read now.
func (p *Bootstrap) data(d *corev3.DataSource) ([]byte, error) {
	switch {
	case d.GetFilename() != "":
		return os.ReadFile(p.at(d.GetFilename()))
	case d.GetInlineString() != "":
		return []byte(d.GetInlineString()), nil
	case len(d.GetInlineBytes()) > 0:
		return d.GetInlineBytes(), nil
	}
	return nil, errors.New("the data source names no file and holds nothing")
}

func (o Options) at(path string) string { return at(o.Root, path) }

func (p *Bootstrap) at(path string) string { return at(p.root, path) }

func at(root, path string) string {
	if root == "" || !filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(root, path)
}

// unmarshal reads YAML or JSON into m; the bootstrap was checked strictly
// before, an SDS file is read as strictly.
func unmarshal(raw []byte, m proto.Message) error {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(js, m)
}
