// Package cost prices xDS responses in bytes on the wire without
// marshalling them: the size of a DiscoveryResponse (State of the World) or
// a DeltaDiscoveryResponse from the encoded sizes of the resources it
// carries. The ADS server uses it to say, for every response it sends, what
// the other protocol would have sent to the same proxy for the same change;
// each formula is checked against proto.Size of the real message.
package cost

import "google.golang.org/protobuf/encoding/protowire"

// Field numbers of the discovery messages (envoy/service/discovery/v3).
// Both responses number version, resources, type URL and nonce alike.
const (
	fieldVersion   = 1 // version_info, system_version_info
	fieldResources = 2
	fieldTypeURL   = 4
	fieldNonce     = 5
	fieldRemoved   = 6 // DeltaDiscoveryResponse.removed_resources

	// discovery.v3.Resource
	fieldResourceVersion = 1
	fieldResourceBody    = 2
	fieldResourceName    = 3
)

// bytesField is the size of a length-delimited field of n bytes.
func bytesField(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

// stringField is the size of a proto3 string field: nothing when empty.
func stringField(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return bytesField(num, len(s))
}

// Header is the size of a response's version, type URL and nonce, the
// same in both protocols.
func Header(version, typeURL, nonce string) int {
	return stringField(fieldVersion, version) + stringField(fieldTypeURL, typeURL) + stringField(fieldNonce, nonce)
}

// SotWEntry is what one resource, an Any of anySize bytes, adds to a
// DiscoveryResponse.
func SotWEntry(anySize int) int { return bytesField(fieldResources, anySize) }

// DeltaEntry is what one resource adds to a DeltaDiscoveryResponse: a
// Resource with its name, version and body.
func DeltaEntry(name, version string, anySize int) int {
	inner := stringField(fieldResourceName, name) + stringField(fieldResourceVersion, version) + bytesField(fieldResourceBody, anySize)
	return bytesField(fieldResources, inner)
}

// Removed is what one name in removed_resources adds to a
// DeltaDiscoveryResponse.
func Removed(name string) int { return bytesField(fieldRemoved, len(name)) }
