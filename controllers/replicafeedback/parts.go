package replicafeedback

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"reflect"
	"strconv"

	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
)

// A replica's report is split into parts, each in a ConfigMap of its own,
// and a manifest that names them: a ConfigMap holds at most 1 MiB, and a
// report takes ~176 bytes per scope before compression, so one object
// would stop holding it at a few thousand scopes.
//
//   - A scope's part is a hash of its key modulo the number of parts, a
//     power of two that grows (and never shrinks while the replica runs)
//     until every part fits maxPartBytes compressed.
//   - Each part is its scopes' report as JSON, gzipped, in binaryData; a
//     part is written only when its content changed.
//   - The manifest is written after the parts it names, with each part's
//     digest (of its JSON): the leader counts a replica's report only when
//     every part it holds matches the manifest's digest, so it never merges
//     a half-written set (a part rewritten for the next manifest, or the
//     parts of a replica that is growing its count); until then it keeps
//     the last whole set. The heartbeat renews the manifest alone.
//   - A part that cannot be written is named in the manifest, with why:
//     the leader keeps what that part last said and marks its scopes'
//     status (Degraded=FeedbackNotReported).
const (
	// ManifestKey holds the manifest in the replica's ConfigMap.
	ManifestKey = "manifest.json"
	// PartKey holds a part's gzipped report in its ConfigMap's binaryData.
	PartKey = "report.json.gz"
	// PartLabel marks a part's ConfigMap; its value is the part's number.
	PartLabel = "xds.scopeplane.dev/replica-feedback-part"
)

// maxPartBytes keeps a part, compressed, under the API server's limit on a
// ConfigMap (1 MiB, with its metadata).
const maxPartBytes = 900 << 10

// maxParts bounds the parts of one replica: 64 parts of 900 KiB hold
// millions of scopes.
const maxParts = 64

// PartName is the ConfigMap of part i of replica's report.
func PartName(replica string, i int) string { return ConfigMapName(replica) + "-" + strconv.Itoa(i) }

// manifest names the parts of a replica's report, in order.
type manifest struct {
	Parts []manifestPart `json:"parts"`
}

type manifestPart struct {
	// Digest is the SHA-256 of the part's JSON as last written; "" when
	// it was never written (then it holds no scope).
	Digest string `json:"digest,omitempty"`
	// Failed, when set, says why the part's current content could not be
	// written: the part holds what it last said (Digest), not what the
	// replica knows now.
	Failed string `json:"failed,omitempty"`
}

// partOf is the part of n that holds key.
func partOf(key model.Key, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key.Namespace))
	_, _ = h.Write([]byte{'/'})
	_, _ = h.Write([]byte(key.Name))
	return int(h.Sum32() % uint32(n))
}

// encodedPart is one part ready to be written.
type encodedPart struct {
	digest string
	gz     []byte
	scopes int
}

// split is a report cut into parts: each part's scopes, and its encoding.
type split struct {
	groups []map[model.Key]feedback.Summary
	parts  []encodedPart
}

// splitReport encodes scopes into as many parts as prev had (one at
// first), doubling them (up to maxParts) until every part fits
// maxPartBytes compressed. A part whose scopes all say what they said in
// prev keeps its encoding: a replica of 50,000 scopes whose proxies are
// quiet does not compress a megabyte a second.
func splitReport(scopes map[model.Key]feedback.Summary, prev *split) (*split, error) {
	n := 1
	if prev != nil {
		n = len(prev.parts)
	}
	for ; ; n *= 2 {
		out := &split{groups: make([]map[model.Key]feedback.Summary, n), parts: make([]encodedPart, n)}
		for i := range out.groups {
			out.groups[i] = map[model.Key]feedback.Summary{}
		}
		for key, s := range scopes {
			out.groups[partOf(key, n)][key] = s
		}
		fits := true
		for i, g := range out.groups {
			if prev != nil && len(prev.parts) == n && sameScopes(prev.groups[i], g) {
				out.parts[i] = prev.parts[i]
				continue
			}
			p, err := encodePart(g, n == maxParts)
			if err != nil {
				return nil, err
			}
			if len(p.gz) > maxPartBytes {
				fits = false
				break
			}
			out.parts[i] = p
		}
		if fits {
			return out, nil
		}
		if n == maxParts {
			return nil, fmt.Errorf("the feedback of %d scopes does not fit %d parts of %d bytes", len(scopes), maxParts, maxPartBytes)
		}
	}
}

// sameScopes reports whether two parts hold the same Summaries.
func sameScopes(a, b map[model.Key]feedback.Summary) bool {
	if len(a) != len(b) {
		return false
	}
	for key, s := range a {
		t, ok := b[key]
		if !ok || !reflect.DeepEqual(s, t) {
			return false
		}
	}
	return true
}

// encodePart renders and compresses one part; thin drops what encode
// drops for a report that is too large (the last resort, at maxParts).
func encodePart(scopes map[model.Key]feedback.Summary, thin bool) (encodedPart, error) {
	var data []byte
	var err error
	if thin {
		data, err = encode(scopes, maxPartBytes*8) // JSON compresses about tenfold; gzip checks the rest
	} else {
		data, err = encode(scopes, 0)
	}
	if err != nil {
		return encodedPart{}, err
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed) // the level is valid
	if _, err := zw.Write(data); err != nil {
		return encodedPart{}, err
	}
	if err := zw.Close(); err != nil {
		return encodedPart{}, err
	}
	return encodedPart{digest: digest(data), gz: buf.Bytes(), scopes: len(scopes)}, nil
}

func digest(data []byte) string {
	d := sha256.Sum256(data)
	return hex.EncodeToString(d[:])
}

// maxPartJSON bounds a part's JSON once decompressed, so that a damaged or
// hostile ConfigMap cannot make the leader inflate gigabytes.
const maxPartJSON = 256 << 20

// decodePart reads a part: its scopes and the digest of its JSON.
func decodePart(gz []byte) (map[model.Key]feedback.Summary, string, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, "", err
	}
	data, err := io.ReadAll(io.LimitReader(zr, maxPartJSON+1))
	if err != nil {
		return nil, "", err
	}
	if len(data) > maxPartJSON {
		return nil, "", fmt.Errorf("the part holds more than %d bytes of JSON", maxPartJSON)
	}
	scopes, err := decode(string(data))
	return scopes, digest(data), err
}

func decodeManifest(data string) (*manifest, error) {
	var m manifest
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		return nil, err
	}
	if len(m.Parts) == 0 || len(m.Parts) > maxParts || len(m.Parts)&(len(m.Parts)-1) != 0 {
		return nil, fmt.Errorf("the manifest names %d parts: a power of two up to %d expected", len(m.Parts), maxParts)
	}
	return &m, nil
}
