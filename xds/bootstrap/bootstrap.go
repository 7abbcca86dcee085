// Package bootstrap renders, for one scope, the two bootstraps a proxy needs
// to join it: an Envoy bootstrap (ADS with the api_type matching the scope's
// protocol) and a gRPC xDS bootstrap. The operator writes both into a
// ConfigMap per ProxyScope, so joining a scope is mounting a file.
package bootstrap

import (
	"encoding/json"
	"fmt"
	"net"
	"path"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	credentialinjectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/credential_injector/v3"
	upstreamcodecv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/upstream_codec/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	genericv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/injected_credentials/generic/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Keys of the bootstrap ConfigMap's data.
const (
	EnvoyKey = "envoy.yaml"
	GRPCKey  = "grpc-bootstrap.json"
	// CAKey holds the CA bundle the proxies verify the control plane's
	// certificate with (absent when the xDS port is plaintext).
	CAKey = "ca.crt"
	// SDSKey holds the file-based SDS resource through which Envoy reads
	// its SPIFFE client certificate (only when proxies present one).
	SDSKey = "envoy-sds.yaml"
	// CASDSKey holds the file-based SDS resource through which Envoy reads
	// the CA bundle (ca.crt), so that it follows a CA rotation without a
	// restart (absent when the xDS port is plaintext).
	CASDSKey = "envoy-sds-ca.yaml"
	// TokenSDSKey holds the file-based SDS resource through which Envoy
	// reads the projected ServiceAccount token it sends (only when Envoy
	// authenticates with the token).
	TokenSDSKey = "envoy-sds-token.yaml"
)

// MountPath is where pods mount their scope's bootstrap ConfigMap, so
// that the bootstraps can name the CA bundle's file: MountPath/ca.crt.
const MountPath = "/etc/scopeplane/xds"

// TLS says how a proxy verifies the control plane and proves who it is; a
// nil *TLS is a plaintext xDS port (--xds-insecure), over which neither a
// token nor a client certificate can be presented.
type TLS struct {
	// CAFile is the path of the CA bundle in the proxy's file system; the
	// ConfigMap's other files are beside it.
	CAFile string
	// Token makes the gRPC bootstrap send the projected ServiceAccount
	// token at TokenPath (the server accepts tokens), and Envoy's too
	// unless SPIFFEDir is set.
	Token bool
	// SPIFFEDir, when set, is where the pod mounts its SPIFFE certificate
	// (tls.crt and tls.key; the server accepts SPIFFE certificates): Envoy
	// presents it instead of sending the token, and so does gRPC when
	// Token is false.
	SPIFFEDir string
}

// SPIFFEDir is where cert-manager's SPIFFE CSI driver is conventionally
// mounted (tls.crt, tls.key, ca.crt); SPIRE's helper can write there too.
const SPIFFEDir = "/var/run/secrets/spiffe.io"

// SDS names of the secrets in SDSKey, CASDSKey and TokenSDSKey. Each file
// holds one secret: Envoy refuses a file-based SDS update with more.
const (
	spiffeSecret = "spiffe"
	caSecret     = "scopeplane-ca"
	tokenSecret  = "scopeplane-token"
)

// TokenPath is where a proxy's pod mounts its projected ServiceAccount
// token (audience scopeplane), which the gRPC bootstrap sends as call
// credentials and Envoy through TokenSDSKey; docs/bootstrap.md shows the
// volume.
const TokenPath = "/var/run/secrets/scopeplane/token"

// XDSClusterName is the Envoy cluster through which Envoy reaches scopeplane.
const XDSClusterName = "scopeplane-xds"

// ConfigMapName is the name of a scope's bootstrap ConfigMap.
func ConfigMapName(scope string) string { return scope + "-xds-bootstrap" }

// Envoy returns an Envoy bootstrap (YAML) that joins scope over ADS at
// server (host:port) with the api_type the scope's protocol requires. With
// tls, the xDS cluster speaks TLS with SNI set to server's host and checks
// the control plane's certificate against the CA that CASDSKey names and
// that host, and it presents Envoy's credential (the token unless
// tls.SPIFFEDir is set, see TLS.envoyToken). The node
// id is a placeholder: run Envoy with --service-node set to the pod's name
// so each proxy is told apart in the scope's status. The result has passed
// ValidateEnvoy.
func Envoy(scope model.Key, protocol model.Protocol, server string, tls *TLS) ([]byte, error) {
	host, port, err := splitHostPort(server)
	if err != nil {
		return nil, err
	}
	apiType := corev3.ApiConfigSource_ApiType(corev3.ApiConfigSource_ApiType_value[protocol.APIType()])
	options := &upstreamhttpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
		}},
	}
	if tls != nil && tls.envoyToken() {
		if options.HttpFilters, err = tokenFilters(tls); err != nil {
			return nil, err
		}
	}
	h2, err := anypb.New(options)
	if err != nil {
		return nil, err
	}
	discovery := clusterv3.Cluster_STRICT_DNS
	if net.ParseIP(host) != nil {
		discovery = clusterv3.Cluster_STATIC
	}
	ads := &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
	b := &bootstrapv3.Bootstrap{
		Node: &corev3.Node{
			Id:       scope.Name + "-envoy",
			Cluster:  scope.Name,
			Metadata: scopeMetadata(scope),
		},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			AdsConfig: &corev3.ApiConfigSource{
				ApiType:                   apiType,
				TransportApiVersion:       corev3.ApiVersion_V3,
				SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: XDSClusterName},
				}}},
			},
			CdsConfig: ads,
			LdsConfig: ads,
		},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{{
			Name:                          XDSClusterName,
			ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: discovery},
			ConnectTimeout:                durationpb.New(5 * time.Second),
			TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2},
			LoadAssignment: &endpointv3.ClusterLoadAssignment{
				ClusterName: XDSClusterName,
				Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socketAddress(host, port)}},
				}}}},
			},
		}}},
		Admin: &bootstrapv3.Admin{Address: socketAddress("127.0.0.1", 9901)},
	}
	if tls != nil {
		ts, err := envoyTLS(host, tls)
		if err != nil {
			return nil, err
		}
		b.StaticResources.Clusters[0].TransportSocket = ts
	}
	out, err := toYAML(b)
	if err != nil {
		return nil, err
	}
	if err := ValidateEnvoy(out); err != nil {
		return nil, fmt.Errorf("rendered Envoy bootstrap is invalid: %w", err)
	}
	return out, nil
}

// envoyToken reports whether Envoy authenticates with the projected token
// rather than a SPIFFE certificate: when the server accepts tokens and no
// SPIFFE certificate. A pod whose operator turned SPIFFE on has the CSI
// driver's volume already, and keeps presenting that certificate as it did
// before Envoy could send a token.
func (t *TLS) envoyToken() bool { return t.Token && t.SPIFFEDir == "" }

// tokenFilters are the xDS cluster's upstream HTTP filters that send the
// projected token on every stream Envoy opens to the control plane, ADS
// included: Envoy's own gRPC client (envoy_grpc) sends only static
// metadata, while the credential injector reads the token through
// file-based SDS (TokenSDSKey) and so follows the kubelet's rotation. An
// upstream filter chain must end with the upstream codec.
func tokenFilters(t *TLS) ([]*hcmv3.HttpFilter, error) {
	generic, err := anypb.New(&genericv3.Generic{
		Credential:        &tlsv3.SdsSecretConfig{Name: tokenSecret, SdsConfig: fileSDS(t, TokenSDSKey)},
		HeaderValuePrefix: "Bearer ",
	})
	if err != nil {
		return nil, err
	}
	injector, err := anypb.New(&credentialinjectorv3.CredentialInjector{
		// A header of the same name from elsewhere never replaces the token.
		Overwrite:  true,
		Credential: &corev3.TypedExtensionConfig{Name: "envoy.http.injected_credentials.generic", TypedConfig: generic},
	})
	if err != nil {
		return nil, err
	}
	codec, err := anypb.New(&upstreamcodecv3.UpstreamCodec{})
	if err != nil {
		return nil, err
	}
	return []*hcmv3.HttpFilter{
		{Name: "envoy.filters.http.credential_injector", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: injector}},
		{Name: "envoy.filters.http.upstream_codec", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: codec}},
	}, nil
}

// fileSDS is the config source of the SDS file key of the ConfigMap,
// beside the CA file, with the ConfigMap's directory watched: the kubelet
// updates a ConfigMap volume by renaming its ..data link there, which
// Envoy sees as a move into the directory and reads the file again.
func fileSDS(t *TLS, key string) *corev3.ConfigSource {
	dir := path.Dir(t.CAFile)
	return &corev3.ConfigSource{
		ResourceApiVersion: corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_PathConfigSource{PathConfigSource: &corev3.PathConfigSource{
			Path: path.Join(dir, key), WatchedDirectory: &corev3.WatchedDirectory{Path: dir},
		}},
	}
}

// envoyTLS is the xDS cluster's transport socket: TLS 1.2 or later, SNI
// host, the server's certificate required to name host (Envoy checks no
// name unless told to) and verified against the CA that CASDSKey names. A
// trusted_ca in the bootstrap would be read once, at start; through SDS
// Envoy reads the CA again when the kubelet swaps the mounted ca.crt.
func envoyTLS(host string, t *TLS) (*corev3.TransportSocket, error) {
	sanType := tlsv3.SubjectAltNameMatcher_DNS
	if net.ParseIP(host) != nil {
		sanType = tlsv3.SubjectAltNameMatcher_IP_ADDRESS
	}
	ctx, err := anypb.New(&tlsv3.UpstreamTlsContext{
		Sni: host,
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsParams:                      &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2},
			AlpnProtocols:                  []string{"h2"},
			TlsCertificateSdsSecretConfigs: clientCertificate(t),
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext: &tlsv3.CertificateValidationContext{
					MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
						SanType: sanType,
						Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: host}},
					}},
				},
				ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: caSecret, SdsConfig: fileSDS(t, CASDSKey)},
			}},
		},
	})
	if err != nil {
		return nil, err
	}
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: ctx}}, nil
}

// clientCertificate is Envoy's SPIFFE certificate, read through the
// ConfigMap's SDS file so that Envoy reloads it when the kubelet swaps the
// files (a static certificate is read once, and a SPIFFE certificate lives
// about an hour); nil when proxies present none.
func clientCertificate(t *TLS) []*tlsv3.SdsSecretConfig {
	if t.SPIFFEDir == "" {
		return nil
	}
	return []*tlsv3.SdsSecretConfig{{Name: spiffeSecret, SdsConfig: fileSDS(t, SDSKey)}}
}

// EnvoySDS returns the file-based SDS resource (YAML, ConfigMap key
// SDSKey) holding Envoy's SPIFFE certificate, or nil when proxies present
// none. Envoy reads the certificate files again when the kubelet swaps the
// directory they are in.
func EnvoySDS(t *TLS) ([]byte, error) {
	if t == nil || t.SPIFFEDir == "" {
		return nil, nil
	}
	return sdsFile(&tlsv3.Secret{Name: spiffeSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path.Join(t.SPIFFEDir, "tls.crt")}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path.Join(t.SPIFFEDir, "tls.key")}},
		WatchedDirectory: &corev3.WatchedDirectory{Path: t.SPIFFEDir},
	}}})
}

// EnvoyCASDS returns the file-based SDS resource (YAML, ConfigMap key
// CASDSKey) through which Envoy trusts the CA bundle at t.CAFile, or nil
// for a plaintext port. The secret watches the CA file's directory, so a
// CA rotation, which the kubelet applies by swapping that directory's
// ..data link, makes Envoy read ca.crt again without a restart.
func EnvoyCASDS(t *TLS) ([]byte, error) {
	if t == nil {
		return nil, nil
	}
	return sdsFile(&tlsv3.Secret{Name: caSecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa:        &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: t.CAFile}},
		WatchedDirectory: &corev3.WatchedDirectory{Path: path.Dir(t.CAFile)},
	}}})
}

// EnvoyTokenSDS returns the file-based SDS resource (YAML, ConfigMap key
// TokenSDSKey) holding the projected token Envoy sends, a generic secret
// read from TokenPath, or nil when Envoy sends no token. Envoy watches the
// token file's directory (a generic secret has no watched_directory of its
// own) and reads the token again when the kubelet renews it.
func EnvoyTokenSDS(t *TLS) ([]byte, error) {
	if t == nil || !t.envoyToken() {
		return nil, nil
	}
	return sdsFile(&tlsv3.Secret{Name: tokenSecret, Type: &tlsv3.Secret_GenericSecret{GenericSecret: &tlsv3.GenericSecret{
		Secret: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: TokenPath}},
	}}})
}

// sdsFile renders one secret as a file-based SDS resource (a
// DiscoveryResponse holding it) and validates it.
func sdsFile(secret *tlsv3.Secret) ([]byte, error) {
	res, err := anypb.New(secret)
	if err != nil {
		return nil, err
	}
	out, err := toYAML(&discoveryv3.DiscoveryResponse{Resources: []*anypb.Any{res}})
	if err != nil {
		return nil, err
	}
	if err := ValidateEnvoySDS(out); err != nil {
		return nil, fmt.Errorf("rendered SDS file is invalid: %w", err)
	}
	return out, nil
}

// toYAML renders an Envoy message with its fields' proto names, as
// Envoy's documentation spells them; YAML sorts the keys, so the output
// is stable (protojson's alone is not).
func toYAML(m proto.Message) ([]byte, error) {
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(js)
}

// GRPC returns a gRPC xDS bootstrap (JSON, for GRPC_XDS_BOOTSTRAP or
// GRPC_XDS_BOOTSTRAP_CONFIG) that joins scope at server, over TLS verified
// against tls.CAFile (gRPC's "tls" channel credentials, which re-read the
// file every 10 minutes) or, without tls, in plaintext. With tls the
// channel credentials are [tls, google_default]: each gRPC takes the first
// type it knows, so grpc-go uses tls, while grpc-js-xds 1.14 and C-core
// 1.51, which know no tls, use google_default (TLS with the default roots,
// which GRPCEnv points at the CA file, and a JWT of the published key,
// which is no credential). gRPC clients speak only State of the World; a
// delta scope refuses them, which its status shows.
func GRPC(scope model.Key, server string, tls *TLS) ([]byte, error) {
	if _, _, err := splitHostPort(server); err != nil {
		return nil, err
	}
	type tlsConfig struct {
		CACertificateFile string `json:"ca_certificate_file"`
		CertificateFile   string `json:"certificate_file,omitempty"`
		PrivateKeyFile    string `json:"private_key_file,omitempty"`
	}
	type creds struct {
		Type   string     `json:"type"`
		Config *tlsConfig `json:"config,omitempty"`
	}
	channel := creds{Type: "insecure"}
	var fallback []creds
	if tls != nil {
		channel = creds{Type: "tls", Config: &tlsConfig{CACertificateFile: tls.CAFile}}
		fallback = []creds{{Type: "google_default"}}
		// gRPC's tls channel credentials present a certificate from files
		// (gRFC A65), read again as they rotate.
		if !tls.Token && tls.SPIFFEDir != "" {
			channel.Config.CertificateFile = path.Join(tls.SPIFFEDir, "tls.crt")
			channel.Config.PrivateKeyFile = path.Join(tls.SPIFFEDir, "tls.key")
		}
	}
	type tokenFile struct {
		Path string `json:"jwt_token_file"`
	}
	type callCreds struct {
		Type   string    `json:"type"`
		Config tokenFile `json:"config"`
	}
	// call_creds is read by grpc-go with
	// GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true (gRFC A97), and only
	// over a secure channel, so a plaintext port's bootstrap has none;
	// other gRPC languages ignore it.
	var call []callCreds
	if tls != nil && tls.Token {
		call = []callCreds{{Type: "jwt_token_file", Config: tokenFile{Path: TokenPath}}}
	}
	type xdsServer struct {
		ServerURI      string      `json:"server_uri"`
		ChannelCreds   []creds     `json:"channel_creds"`
		CallCreds      []callCreds `json:"call_creds,omitempty"`
		ServerFeatures []string    `json:"server_features"`
	}
	// locality is empty but present: grpc-js-xds refuses a bootstrap whose
	// node has no locality object ("locality field missing in node
	// element"), and every other gRPC reads an empty one as no locality.
	type locality struct{}
	type node struct {
		ID       string            `json:"id"`
		Cluster  string            `json:"cluster"`
		Locality locality          `json:"locality"`
		Metadata map[string]string `json:"metadata"`
	}
	return json.MarshalIndent(struct {
		XDSServers []xdsServer `json:"xds_servers"`
		Node       node        `json:"node"`
	}{
		XDSServers: []xdsServer{{ServerURI: server, ChannelCreds: append([]creds{channel}, fallback...), CallCreds: call, ServerFeatures: []string{"xds_v3"}}},
		Node:       node{ID: scope.Name + "-grpc", Cluster: scope.Name, Metadata: map[string]string{model.ScopeMetadataKey: scope.String()}},
	}, "", "  ")
}

func scopeMetadata(scope model.Key) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{model.ScopeMetadataKey: structpb.NewStringValue(scope.String())}}
}

func socketAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

func splitHostPort(server string) (string, uint32, error) {
	host, p, err := net.SplitHostPort(server)
	if err != nil {
		return "", 0, fmt.Errorf("xDS server address %q: %w", server, err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil || port == 0 || host == "" {
		return "", 0, fmt.Errorf("xDS server address %q: want host:port with a port in 1-65535", server)
	}
	return host, uint32(port), nil
}
