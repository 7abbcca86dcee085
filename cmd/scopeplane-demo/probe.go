package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/scopeplane/scopeplane/internal/envoyprobe"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// runProbe joins the scope of an Envoy bootstrap as Envoy would (-c and
// --service-node as Envoy takes them), reconnecting when a stream ends, and
// serves /ready (a stream is open and the probe is initialized as Envoy
// would be) and /status.
func runProbe(args []string) error {
	fs := flag.NewFlagSet("envoy-probe", flag.ContinueOnError)
	config := fs.String("c", "/etc/scopeplane/xds/envoy.yaml", "The Envoy bootstrap, as Envoy's -c.")
	node := fs.String("service-node", "", "The node id, as Envoy's --service-node.")
	cluster := fs.String("service-cluster", "", "The node cluster, as Envoy's --service-cluster.")
	listen := fs.String("listen", ":8080", "Where /ready and /status are served.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var (
		mu       sync.Mutex
		st       envoyprobe.Status
		answered = map[string]bool{}
		c        *adsclient.Client
	)
	onEvent := func(ev adsclient.Event) {
		mu.Lock()
		defer mu.Unlock()
		if !ev.Accepted {
			st.NACKs++
			return
		}
		answered[ev.TypeURL] = true
	}
	// status is st now; mu is held.
	status := func() envoyprobe.Status {
		out := st
		out.Synced = c != nil && c.Running() && answered[xdstype.Cluster.URL()] && answered[xdstype.Listener.URL()] &&
			(len(c.State(xdstype.Cluster.URL())) == 0 || answered[xdstype.Endpoint.URL()]) &&
			(len(c.State(xdstype.Listener.URL())) == 0 || answered[xdstype.Route.URL()])
		return out
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !status().Synced {
			http.Error(w, "no stream is open, or clusters, listeners, or their endpoints or routes were never answered", http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		out := status()
		client := c
		mu.Unlock()
		if client != nil {
			out.Held, out.Endpoints, out.Routes = map[string]int{}, map[string][]string{}, map[string][]string{}
			for _, t := range xdstype.All() {
				out.Held[t.String()] = len(client.State(t.URL()))
			}
			for name, h := range client.State(xdstype.Endpoint.URL()) {
				cla, err := adsclient.Decode[*endpointv3.ClusterLoadAssignment](h)
				if err != nil {
					continue
				}
				out.Endpoints[name] = []string{}
				for _, l := range cla.GetEndpoints() {
					for _, e := range l.GetLbEndpoints() {
						out.Endpoints[name] = append(out.Endpoints[name], e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
					}
				}
			}
			for _, h := range client.State(xdstype.Route.URL()) {
				if rc, err := adsclient.Decode[*routev3.RouteConfiguration](h); err == nil {
					for _, vh := range rc.GetVirtualHosts() {
						out.Routes[vh.GetName()] = routeTargets(vh)
					}
				}
			}
			for name, h := range client.State(xdstype.VirtualHost.URL()) {
				if vh, err := adsclient.Decode[*routev3.VirtualHost](h); err == nil {
					out.Routes[name] = routeTargets(vh)
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { log.Fatal(srv.ListenAndServe()) }()

	for backoff := time.Second; ctx.Err() == nil; {
		// The files are read again for every stream, as Envoy follows them.
		b, err := envoyprobe.Load(*config, envoyprobe.Options{ServiceNode: *node, ServiceCluster: *cluster})
		if err == nil {
			mu.Lock()
			if c == nil {
				cfg := adsclient.WildcardConfig(b.Protocol, b.Node)
				cfg.OnEvent = onEvent
				c = adsclient.New(cfg)
				log.Printf("envoy-probe: node %q, %s to %s", b.Node.GetId(), b.Protocol, b.Address)
			}
			st.Streams++
			client := c
			mu.Unlock()
			joined := time.Now()
			err = b.Run(ctx, client)
			if time.Since(joined) > time.Minute {
				backoff = time.Second
			}
		}
		mu.Lock()
		if err != nil && !errors.Is(err, context.Canceled) {
			st.LastError = err.Error()
		}
		mu.Unlock()
		log.Printf("envoy-probe: stream ended: %v; again in %s", err, backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	return nil
}

// routeTargets says where each route of a virtual host sends requests, as
// envoyprobe.Status.Routes holds it.
func routeTargets(vh *routev3.VirtualHost) []string {
	out := make([]string, 0, len(vh.GetRoutes()))
	for _, r := range vh.GetRoutes() {
		switch a := r.GetRoute(); {
		case r.GetDirectResponse() != nil:
			out = append(out, fmt.Sprint("status ", r.GetDirectResponse().GetStatus()))
		case a.GetCluster() != "":
			out = append(out, a.GetCluster())
		default:
			var split []string
			for _, c := range a.GetWeightedClusters().GetClusters() {
				split = append(split, fmt.Sprintf("%s=%d", c.GetName(), c.GetWeight().GetValue()))
			}
			out = append(out, strings.Join(split, " "))
		}
	}
	return out
}
