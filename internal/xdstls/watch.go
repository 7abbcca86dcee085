package xdstls

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
)

// rereadEvery is how often WatchDir reads the files again whatever the
// directory watch reported: a safety net for file systems whose changes
// inotify does not see.
const rereadEvery = time.Minute

// LoadDir sets c from dir's tls.crt, tls.key and ca.crt.
func LoadDir(dir string, c *Certificates) error {
	var pem [3][]byte
	for i, name := range []string{CertFile, KeyFile, CAFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("xDS TLS directory: %w", err)
		}
		pem[i] = b
	}
	if err := c.Set(pem[0], pem[1], pem[2]); err != nil {
		return fmt.Errorf("xDS TLS directory %s: %w", dir, err)
	}
	return nil
}

// WatchDir loads dir into c, then loads it again whenever something in
// dir changes, until ctx ends. It watches the directory rather than the
// files: a Kubernetes Secret volume replaces its files at once by
// swapping the `..data` symlink, and an editor or cert-manager's CSI
// driver renames new files into place; both are changes to the directory.
// A set of files that does not load (half written, or a key that does not
// match) is logged and the previous certificate kept. Only the first load
// failing is an error: there is nothing to serve.
func WatchDir(ctx context.Context, dir string, c *Certificates, log logr.Logger) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching the xDS TLS directory: %w", err)
	}
	defer func() { _ = w.Close() }()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watching the xDS TLS directory %s: %w", dir, err)
	}
	if err := LoadDir(dir, c); err != nil {
		return err
	}
	reread := time.NewTicker(rereadEvery)
	defer reread.Stop()
	reload := func() {
		if err := LoadDir(dir, c); err != nil {
			log.Error(err, "reloading the xDS serving certificate; still serving the previous one")
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.Events:
			reload()
		case err := <-w.Errors:
			log.Error(err, "watching the xDS TLS directory", "dir", dir)
		case <-reread.C:
			reload()
		}
	}
}
