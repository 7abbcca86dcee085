package feedback

import (
	"math"
	"strings"
	"unicode/utf8"
)

// The most characters of each field of a NACK that are kept: the maxLength
// of the matching field of status.recentNACKs (api/v1alpha1.ProxyNACK), so
// that nothing a proxy sends can make a status patch invalid. The API
// server counts maxLength in characters (Unicode code points), not bytes.
const (
	MaxNodeChars    = 253
	MaxTypeURLChars = 253
	MaxVersionChars = 128
	MaxDetailChars  = 1024
	MaxZoneChars    = 63
)

// Cut returns s as valid UTF-8 of at most maxChars characters and maxBytes
// bytes: each byte that is not part of valid UTF-8 becomes U+FFFD, and the
// text ends at the last whole character that fits. Its work is bounded by
// the limits, not by the length of s.
func Cut(s string, maxChars, maxBytes int) string {
	if len(s) <= maxChars && len(s) <= maxBytes && utf8.ValidString(s) {
		return s // every character is at least one byte
	}
	var b strings.Builder
	chars := 0
	for _, r := range s { // an invalid byte reads as utf8.RuneError
		if chars == maxChars || b.Len()+utf8.RuneLen(r) > maxBytes {
			break
		}
		b.WriteRune(r)
		chars++
	}
	return b.String()
}

// NodeID is a proxy's node id as NACKs record it: cut to MaxNodeChars
// characters of valid UTF-8. A NACK names its proxy by this form, so that is
// what to compare a connected proxy's Node with.
func NodeID(id string) string { return Cut(id, MaxNodeChars, math.MaxInt) }
