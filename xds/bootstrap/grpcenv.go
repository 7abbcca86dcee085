package bootstrap

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/scopeplane/scopeplane/xds/auth"
)

// Keys of the bootstrap ConfigMap for proxyless gRPC clients.
const (
	// TLSOnlyKeyKey holds the published, identity-less service-account key
	// (JSON) that grpc-js-xds and gRPC C-core read through
	// GOOGLE_APPLICATION_CREDENTIALS: their only TLS channel credentials,
	// google_default, need one. The JWT they sign with it is no credential
	// (auth.PublishedKeyID); they are admitted by their peer address.
	TLSOnlyKeyKey = "tls-only-key.json"
	// GRPCEnvKey holds, in env-file format (NAME=value lines, # comments),
	// the environment variables a proxyless gRPC client of the scope sets.
	// It is one key, not one key per variable, because envFrom would turn
	// every other key of the ConfigMap into a variable too; a Pod copies
	// the lines into its container's env (docs/bootstrap.md).
	GRPCEnvKey = "grpc-env"
)

// serviceAccountKey is the JSON of a Google service-account key, the one
// format both google-auth-library (grpc-js) and C-core's google_default
// credentials read from GOOGLE_APPLICATION_CREDENTIALS. Both require
// type, client_email and private_key (C-core also private_key_id and
// client_id); with no scopes they sign a JWT locally, kid private_key_id,
// and never contact token_uri.
type serviceAccountKey struct {
	Type         string `json:"type"`
	ProjectID    string `json:"project_id"`
	PrivateKeyID string `json:"private_key_id"`
	PrivateKey   string `json:"private_key"`
	ClientEmail  string `json:"client_email"`
	ClientID     string `json:"client_id"`
	TokenURI     string `json:"token_uri"`
}

// tlsOnlyEmail is the key's client_email: .invalid (RFC 2606), so that
// nothing could ever accept it as an account.
const tlsOnlyEmail = "tls-only@scopeplane.invalid"

// NewTLSOnlyKey makes a new published key (TLSOnlyKeyKey): an RSA-2048
// key, since service-account keys are RS256 for both clients. It is made
// once per install and kept (package bootstrapconfig), so that the
// ConfigMaps do not change with every leader.
func NewTLSOnlyKey() ([]byte, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(serviceAccountKey{
		Type: "service_account", ProjectID: "scopeplane", PrivateKeyID: auth.PublishedKeyID,
		PrivateKey:  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		ClientEmail: tlsOnlyEmail, ClientID: "0",
		// Never contacted (no scopes are asked for); an unroutable
		// address in case a client ever tries.
		TokenURI: "https://token.scopeplane.invalid/",
	}, "", "  ")
}

// CheckTLSOnlyKey reports why data is not a published key NewTLSOnlyKey
// makes: a key found in an existing ConfigMap is kept only when it is.
func CheckTLSOnlyKey(data []byte) error {
	var k serviceAccountKey
	if err := json.Unmarshal(data, &k); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if k.Type != "service_account" || k.PrivateKeyID != auth.PublishedKeyID || k.ClientEmail != tlsOnlyEmail || k.ClientID == "" {
		return errors.New("not the published service-account key")
	}
	block, _ := pem.Decode([]byte(k.PrivateKey))
	if block == nil || block.Type != "PRIVATE KEY" {
		return errors.New("private_key is not a PEM PRIVATE KEY")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return fmt.Errorf("private_key: %w", err)
	}
	if rk, ok := key.(*rsa.PrivateKey); !ok || rk.N.BitLen() < 2048 {
		return errors.New("private_key is not an RSA key of 2048 bits or more")
	}
	return nil
}

// GRPCEnv returns the env-file (GRPCEnvKey) of a proxyless gRPC client
// whose Pod mounts the ConfigMap at dir, for a port with tls (nil:
// plaintext). grpc-go reads the bootstrap's call_creds only with
// GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS; grpc-js-xds and C-core take
// the bootstrap's google_default channel credentials, which read the key
// from GOOGLE_APPLICATION_CREDENTIALS and trust the roots in
// GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (once, at the process's first TLS
// channel). Each variable is read by only the clients it names and
// ignored by the others, so one set serves all three.
func GRPCEnv(dir string, tls *TLS) []byte {
	var b strings.Builder
	b.WriteString("# The environment of a proxyless gRPC client of this scope (docs/bootstrap.md):\n")
	b.WriteString("# set each line in the container's env; envFrom does not read env-files.\n")
	fmt.Fprintf(&b, "GRPC_XDS_BOOTSTRAP=%s\n", path.Join(dir, GRPCKey))
	if tls != nil {
		if tls.Token {
			b.WriteString("# grpc-go: send the token file of the bootstrap's call_creds.\n")
			b.WriteString("GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true\n")
		}
		b.WriteString("# grpc-js-xds and gRPC C-core: TLS to the xDS server through google_default\n")
		b.WriteString("# (the key is identity-less; the scope admits them by peer address), and\n")
		b.WriteString("# the CA as the process's default roots (read once: restart after a CA rotation).\n")
		fmt.Fprintf(&b, "GOOGLE_APPLICATION_CREDENTIALS=%s\n", path.Join(dir, TLSOnlyKeyKey))
		fmt.Fprintf(&b, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=%s\n", tls.CAFile)
	}
	return []byte(b.String())
}
