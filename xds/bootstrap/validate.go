package bootstrap

import (
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/xds/envoyvalid"
)

// ValidateEnvoy checks an Envoy bootstrap (YAML or JSON) against Envoy's
// API the way Envoy reads it: strictly (an unknown field, in the bootstrap
// or in any typed config within it, is an error, as Envoy refuses one in
// its static config), every Any resolved to a registered type, and every
// message, the contents of each Any included, passing its generated
// ValidateAll. ValidateAll alone stops at an Any: a filter's typed config
// would go unchecked.
func ValidateEnvoy(config []byte) error {
	b := &bootstrapv3.Bootstrap{}
	if err := unmarshalStrict(config, b); err != nil {
		return err
	}
	return envoyvalid.Message(b)
}

// ValidateEnvoySDS checks a file-based SDS resource (YAML or JSON) as
// Envoy reads it: a DiscoveryResponse of exactly one Secret (Envoy refuses
// a file with more), read strictly and validated like ValidateEnvoy.
func ValidateEnvoySDS(file []byte) error {
	resp := &discoveryv3.DiscoveryResponse{}
	if err := unmarshalStrict(file, resp); err != nil {
		return err
	}
	if n := len(resp.GetResources()); n != 1 {
		return fmt.Errorf("the SDS file holds %d resources, want exactly one Secret", n)
	}
	if !resp.GetResources()[0].MessageIs(&tlsv3.Secret{}) {
		return fmt.Errorf("the SDS file holds a %s, want a Secret", resp.GetResources()[0].GetTypeUrl())
	}
	return envoyvalid.Message(resp)
}

func unmarshalStrict(in []byte, m proto.Message) error {
	js, err := yaml.YAMLToJSON(in)
	if err != nil {
		return fmt.Errorf("not YAML: %w", err)
	}
	// protojson refuses unknown fields and unregistered Any types unless
	// told otherwise.
	if err := protojson.Unmarshal(js, m); err != nil {
		return fmt.Errorf("not a %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}
