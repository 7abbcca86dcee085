package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/xds/model"
)

// statusWatch follows every scope's status through an informer of the
// driver's own.
type statusWatch struct {
	want   map[model.Key]int32
	cancel context.CancelFunc

	mu      sync.Mutex
	current map[model.Key]bool
	// turned is when the last scope became current or stopped being so,
	// and last when the last status changed at all, since reset.
	turned, last time.Time
}

// statusQuiet is how long every status must stay current before the
// statuses count as current.
const statusQuiet = 3 * time.Second

func watchStatuses(env *worldEnv, want map[model.Key]int32) (*statusWatch, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &statusWatch{want: want, cancel: cancel, current: map[model.Key]bool{}}
	c, err := cache.New(env.Config, cache.Options{Scheme: scheme.Scheme})
	if err != nil {
		cancel()
		return nil, err
	}
	inf, err := c.GetInformer(ctx, &xdsv1alpha1.ProxyScope{})
	if err != nil {
		cancel()
		return nil, err
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { s.see(nil, o.(*xdsv1alpha1.ProxyScope)) },
		UpdateFunc: func(old, o any) {
			s.see(old.(*xdsv1alpha1.ProxyScope), o.(*xdsv1alpha1.ProxyScope))
		},
	}); err != nil {
		cancel()
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		cancel()
		return nil, errors.New("the driver's ProxyScope informer did not sync")
	}
	return s, nil
}

// see records whether a scope's status is current: it counts every proxy
// of the scope connected and in sync, at the scope's generation.
func (s *statusWatch) see(old, ps *xdsv1alpha1.ProxyScope) {
	k := model.Key{Namespace: ps.Namespace, Name: ps.Name}
	n, ok := s.want[k]
	if !ok {
		return // another shard's
	}
	st := ps.Status
	cur := st.ObservedGeneration == ps.Generation && st.SyncedProxies == n && st.ConnectedProxies != nil && *st.ConnectedProxies == n
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if was, seen := s.current[k]; seen && was != cur {
		s.turned = now
	}
	s.current[k] = cur
	if old != nil && !equality.Semantic.DeepEqual(old.Status, ps.Status) {
		s.last = now
	}
}

func (s *statusWatch) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.turned, s.last = time.Time{}, time.Time{}
}

func (s *statusWatch) stop() { s.cancel() }

// wait waits until every scope's status is current and has stayed so for
// statusQuiet, or the deadline, and says how the statuses got there since
// start; writes0 is the API server's count of status writes at start.
// Status changes that keep a status current (the cost window moving on)
// do not hold it up, and are counted among the writes.
func (s *statusWatch) wait(start time.Time, env *worldEnv, writes0 int64, timeout time.Duration) StatusWrites {
	var out StatusWrites
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		stale := 0
		for _, cur := range s.current {
			if !cur {
				stale++
			}
		}
		turned := s.turned
		s.mu.Unlock()
		since := start
		if turned.After(start) {
			since = turned
		}
		if stale == 0 && time.Since(since) >= statusQuiet || time.Now().After(deadline) {
			out.Stale = stale
			out.Current = since.Sub(start)
			if w, err := env.statusWrites(); err == nil {
				out.Writes = w - writes0
			}
			if elapsed := time.Since(start); elapsed > 0 {
				out.Rate = float64(out.Writes) / elapsed.Seconds()
			}
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// statusWrites is how many ProxyScope status writes the API server has
// served, from its metrics.
func (e *worldEnv) statusWrites() (int64, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return 0, err
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		return 0, err
	}
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return 0, err
	}
	var n float64
	for _, m := range families["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["resource"] == "proxyscopes" && l["subresource"] == "status" && (l["verb"] == "PATCH" || l["verb"] == "PUT" || l["verb"] == "APPLY") {
			n += m.GetCounter().GetValue()
		}
	}
	return int64(n), nil
}

// The layers of the operator's live heap, by what allocated each byte:
// the deepest frame of its allocation's stack that belongs to one of
// them names it. The catalog's layer holds the model and the translated
// resources, which the snapshots share; the snapshots' their encoding and
// versions.
var heapLayerFrames = []struct{ layer, prefix string }{
	{"streams", "github.com/scopeplane/scopeplane/xds/server."},
	{"streams", "google.golang.org/grpc."},
	{"snapshots", "github.com/scopeplane/scopeplane/xds/snapshot."},
	{"snapshots", "github.com/scopeplane/scopeplane/xds/pipeline."},
	{"informer caches", "github.com/scopeplane/scopeplane/controllers/convert.Strip"},
	{"catalog", "github.com/scopeplane/scopeplane/xds/translate."},
	{"catalog", "github.com/scopeplane/scopeplane/xds/catalog."},
	{"catalog", "github.com/scopeplane/scopeplane/controllers/convert."},
	{"feedback and status", "github.com/scopeplane/scopeplane/xds/feedback."},
	{"feedback and status", "github.com/scopeplane/scopeplane/controllers/status."},
	{"informer caches", "k8s.io/client-go/tools/cache."},
	{"informer caches", "sigs.k8s.io/controller-runtime/pkg/cache."},
	{"informer caches", "k8s.io/apimachinery/"},
	{"informer caches", "k8s.io/api/"},
}

// heapLayers splits a heap profile's in-use bytes into the layers of
// heapLayerFrames ("other" for the rest).
func heapLayers(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return nil, err
	}
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "inuse_space" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, errors.New("the heap profile has no inuse_space")
	}
	out := map[string]int64{}
	for _, sm := range p.Sample {
		out[layerOf(sm)] += sm.Value[idx]
	}
	return out, nil
}

func layerOf(sm *profile.Sample) string {
	for _, loc := range sm.Location { // the leaf first
		for _, line := range loc.Line {
			if line.Function == nil {
				continue
			}
			for _, f := range heapLayerFrames {
				if strings.HasPrefix(line.Function.Name, f.prefix) {
					return f.layer
				}
			}
		}
	}
	return "other"
}

// apiProfile writes a CPU profile of the API server over the given span to
// path: what a start's status writes cost the server that answers them.
func (e *worldEnv) apiProfile(span time.Duration, path string) error {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", fmt.Sprint(int(span.Seconds()))).Timeout(span + time.Minute).DoRaw(context.Background())
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}
