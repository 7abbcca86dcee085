package apiserver

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	ctrl "sigs.k8s.io/controller-runtime"
)

// errorLog keeps the control plane's error log lines, which tests read to
// check that a failure was reported.
var errorLog struct {
	mu    sync.Mutex
	lines []string
}

func TestMain(m *testing.M) {
	ctrl.SetLogger(funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"error"`) {
			errorLog.mu.Lock()
			errorLog.lines = append(errorLog.lines, prefix+" "+args)
			errorLog.mu.Unlock()
		}
	}, funcr.Options{}))
	os.Exit(m.Run())
}

// logged reports whether an error log line holds every one of parts.
func logged(parts ...string) bool {
	errorLog.mu.Lock()
	defer errorLog.mu.Unlock()
	for _, l := range errorLog.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}
