package auth

import "time"

// SetClock makes v read the time from now, so that tests step over the
// key refresh intervals.
func SetClock(v *TokenVerifier, now func() time.Time) { v.now = now }
