// Package clip cuts text that came from a client before the server keeps
// it or quotes it back: a refusal must not echo an unbounded value (a proxy
// that sends 20 MiB must not get 20 MiB back, nor make the server hold it
// for the error), and what is kept or logged must be valid UTF-8.
package clip

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// QuoteBytes is the most client input one Quote reproduces.
const QuoteBytes = 128

// String returns s cut to at most n bytes on a rune boundary, with invalid
// UTF-8 replaced by U+FFFD. Replacing happens before cutting, so the result
// never exceeds n bytes.
func String(s string, n int) string {
	if len(s) <= n && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		// A byte that is not valid UTF-8 ranges as utf8.RuneError, three
		// bytes once written.
		size := utf8.RuneLen(r)
		if b.Len()+size > n {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Quote returns s quoted for an error message, cut to QuoteBytes of input;
// a cut value says how long the original was, which is what the reader
// needs to see that it was too long.
func Quote(s string) string {
	c := String(s, QuoteBytes)
	q := strconv.Quote(c)
	if c != s {
		q += "… (" + strconv.Itoa(len(s)) + " bytes)"
	}
	return q
}
