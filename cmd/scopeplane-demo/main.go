// Command scopeplane-demo is the workload of the quickstart (and of the
// end-to-end test, which runs the quickstart's manifests): a gRPC backend
// ("whoami", internal/whoami answering with its Pod's name), a proxyless
// gRPC client ("xds-client", grpc-go's xDS resolver) that calls it through a
// scope without pause and counts every RPC, so that a user (or the test) can
// see that a rollout failed none, and "envoy-probe" (internal/envoyprobe),
// which joins a scope with an Envoy bootstrap as Envoy would, for where no
// Envoy runs. One static binary in one image, because a
// node without a registry must get by with what it is given: "pause" makes
// the same image the Pod sandbox of the node hack/cluster/node.sh builds.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and balancers

	"github.com/scopeplane/scopeplane/internal/whoami"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: scopeplane-demo whoami|xds-client|envoy-probe|pause [flags]")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "pause":
		pause()
	case "whoami":
		err = serveWhoami(args)
	case "xds-client":
		err = runClient(args)
	case "envoy-probe":
		err = runProbe(args)
	default:
		err = fmt.Errorf("unknown command %q (whoami, xds-client, envoy-probe, pause)", cmd)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// pause holds a Pod's namespaces until the runtime stops it, like the
// Kubernetes pause container.
func pause() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// serveWhoami answers with the Pod's name. On SIGTERM it keeps serving for
// -drain, the time the control plane needs to take the terminating Pod out of
// the endpoints it serves, then stops gracefully: what a backend must do for
// a rollout to fail no RPC.
func serveWhoami(args []string) error {
	fs := flag.NewFlagSet("whoami", flag.ContinueOnError)
	port := fs.Int("port", 50051, "The port to serve on.")
	drain := fs.Duration("drain", 5*time.Second, "How long to keep serving after SIGTERM.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	lis, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		return err
	}
	b := whoami.Serve(name, lis)
	log.Printf("whoami %s serving on %s", name, lis.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	log.Printf("whoami %s: terminating, draining for %s", name, *drain)
	time.Sleep(*drain)
	b.GracefulStop()
	return nil
}

// counts is what the client has seen, served as JSON on /counts.
type counts struct {
	mu        sync.Mutex
	OK        int64            `json:"ok"`
	Failed    int64            `json:"failed"`
	ByBackend map[string]int64 `json:"byBackend"`
	LastError string           `json:"lastError,omitempty"`
	// ByError counts the failed RPCs by their error, up to maxErrors
	// distinct errors (the rest count under "other").
	ByError map[string]int64 `json:"byError,omitempty"`
}

// maxErrors bounds the distinct errors counts keeps.
const maxErrors = 20

// runClient calls whoami through -target without pause and counts every RPC.
func runClient(args []string) error {
	fs := flag.NewFlagSet("xds-client", flag.ContinueOnError)
	target := fs.String("target", "", "The xds:/// target to call.")
	listen := fs.String("listen", ":8080", "Where /counts and /ready are served.")
	interval := fs.Duration("interval", 20*time.Millisecond, "Pause between RPCs.")
	timeout := fs.Duration("timeout", 5*time.Second, "Each RPC's deadline.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *target == "" {
		return errors.New("xds-client: -target is required")
	}
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	c := &counts{ByBackend: map[string]int64{}, ByError: map[string]int64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/counts", func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c)
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.OK == 0 {
			http.Error(w, "no RPC has succeeded yet", http.StatusServiceUnavailable)
		}
	})
	go func() { log.Fatal(http.ListenAndServe(*listen, mux)) }()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		name, err := whoami.Call(ctx, conn)
		cancel()
		c.mu.Lock()
		if err != nil {
			c.Failed++
			c.LastError = err.Error()
			if _, ok := c.ByError[c.LastError]; ok || len(c.ByError) < maxErrors {
				c.ByError[c.LastError]++
			} else {
				c.ByError["other"]++
			}
			log.Printf("RPC failed: %v", err)
		} else {
			c.OK++
			c.ByBackend[name]++
		}
		c.mu.Unlock()
		time.Sleep(*interval)
	}
}
