// Package sourcedate reads SOURCE_DATE_EPOCH, the time every file of a
// reproducible build carries (reproducible-builds.org): the release's image
// and plugin archives are stamped with it, not with the time they are built.
package sourcedate

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// Time is SOURCE_DATE_EPOCH, or the Unix epoch when it is not set; a value
// that is not a number of seconds is an error, not a silent epoch.
func Time() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", v, err)
	}
	return time.Unix(s, 0).UTC(), nil
}
