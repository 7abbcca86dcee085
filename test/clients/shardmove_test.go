package clients

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// TestClientMatrixShardMove turns sharding on under running clients of
// each kind, as changing the chart's sharding.shards from 1 to 2 does
// (docs/sharding.md): the one replica stops, and two shards start, shard 0
// at the address the clients' bootstrap names (the chart keeps its
// Service's name) and shard 1, which owns the clients' scope, at a new
// one. What a user is told to expect, each client must do:
// not one RPC fails while its scope moves; running, it keeps the
// configuration it holds, refused by its old address with the new one and
// given no update; restarted on the rewritten bootstrap, it joins the
// scope's shard and follows every change again.
func TestClientMatrixShardMove(t *testing.T) {
	node, python, _, clientNS := matrixNetwork(t)
	dir := t.TempDir()
	env := startAPI(t)
	c := env.Client
	old, err := net.Listen("tcp", net.JoinHostPort(hostAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	oldAddr := old.Addr().String()
	_, stopUnsharded := startReplica(t, env, dir, old, shard.Shards{})
	name := movingScope(t)
	createClients(t, c, scope(name, xdsv1alpha1.ProtocolSotW))
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whoami-1"}}
	token := writeToken(t, c, dir, "grpc-go")
	kinds := []string{"grpc-go", "grpc-js-xds", "c-core"}
	start := func(kind, boot string, env []string) *runner {
		switch kind {
		case "grpc-go":
			return startGo(t, boot, token, matrixPace)
		case "grpc-js-xds":
			return startChild(t, kind, clientNS[kind], boot, append(slices.Clone(env), matrixPace.env()...), node, filepath.Join(".", "client.js"), target)
		default:
			return startChild(t, kind, clientNS[kind], boot, append(slices.Clone(env), matrixPace.env()...), python, filepath.Join(".", "client.py"), target)
		}
	}
	boot, grpcEnv := writeBootstrap(t, c, dir, name)
	clients := map[string]*runner{}
	for _, k := range kinds {
		clients[k] = start(k, boot, grpcEnv)
	}
	m := &matrix{kinds: kinds, cells: map[string]map[string]string{}}
	defer func() { t.Log("\n" + m.String()) }()
	expect := func(scenario, what string, want func(result) bool) {
		for _, k := range kinds {
			m.record(t, scenario, k, what, clients[k], want)
		}
	}
	expect("unsharded", "backend-a", backend("backend-a"))

	// Two shards replace the one replica: shard 0 at the old address,
	// where the running clients reconnect, and the scope's, shard 1, at a
	// new one.
	const moving = "sharding turned on: the scope moves to a new address"
	from := map[string]int{}
	for _, k := range kinds {
		from[k] = clients[k].count()
	}
	stopUnsharded()
	moved, err := net.Listen("tcp", net.JoinHostPort(hostAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = moved.Close() })
	lis, err := net.Listen("tcp", oldAddr)
	if err != nil {
		t.Fatal(err)
	}
	stayed := &sources{Listener: lis, seen: map[string]bool{}}
	addrs := []string{oldAddr, moved.Addr().String()}
	startReplica(t, env, dir, moved, shard.Shards{Index: 1, Addresses: addrs})
	other, _ := startReplica(t, env, dir, stayed, shard.Shards{Index: 0, Addresses: addrs})
	testkit.Eventually(t, "the scope's bootstrap rewritten to its shard's address", func() (bool, string) {
		cm := &corev1.ConfigMap{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bootstrap.ConfigMapName(name)}, cm); err != nil {
			return false, err.Error()
		}
		return strings.Contains(cm.Data[bootstrap.GRPCKey], moved.Addr().String()), cm.Data[bootstrap.GRPCKey]
	})
	for _, k := range kinds {
		m.recordSteady(t, moving, k, "backend-a while its old address refuses it", clients[k], steadyResults, backend("backend-a"))
	}
	// Each client reconnected to the old address, from its own, and
	// the shard there refused their streams, telling them the new one.
	testkit.Eventually(t, "every client refused by the scope's old address", func() (bool, string) {
		n := other.Feedback.Get(model.Key{}).Refused[server.RefusedWrongShard]
		from := stayed.from()
		ok := n >= int64(len(kinds))
		for _, ip := range []string{hostAddr, addrJS, addrCCore} {
			ok = ok && slices.Contains(from, ip)
		}
		return ok, fmt.Sprintf("%d %s refusals, connections from %v", n, server.RefusedWrongShard, from)
	})
	// An endpoint change reaches no running client: they hold what they
	// held, and backend-a still answers.
	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{addrB} })
	for _, k := range kinds {
		m.recordSteady(t, moving, k, "still backend-a after the endpoints moved (no update until restarted)", clients[k], steadyResults, backend("backend-a"))
		m.recordNoFailures(t, moving, k, clients[k], from[k])
	}

	// Restarted on the rewritten bootstrap, each joins the scope's shard,
	// gets the endpoints as they are and follows the next change.
	const restarted = "restarted on the rewritten bootstrap"
	boot, grpcEnv = writeBootstrap(t, c, dir, name)
	for _, k := range kinds {
		clients[k].stop()
		clients[k] = start(k, boot, grpcEnv)
	}
	expect(restarted, "backend-b", backend("backend-b"))
	for _, k := range kinds {
		from[k] = clients[k].count()
	}
	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{addrA} })
	expect(restarted, "then backend-a as the endpoints move back", backend("backend-a"))
	for _, k := range kinds {
		m.recordNoFailures(t, restarted, k, clients[k], from[k])
	}
}

// movingScope is the name of a scope of the client matrix's namespace
// that shard 1 of two owns, so that turning sharding on moves it.
func movingScope(t *testing.T) string {
	for i := range 64 {
		name := fmt.Sprintf("moving-%d", i)
		if shard.Of(model.Key{Namespace: ns, Name: name}, 2) == 1 {
			return name
		}
	}
	t.Fatal("no scope name of 64 is shard 1's of two")
	return ""
}

// sources is a listener that records the addresses its connections come
// from.
type sources struct {
	net.Listener
	mu   sync.Mutex
	seen map[string]bool
}

func (s *sources) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err == nil {
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			s.mu.Lock()
			s.seen[a.IP.String()] = true
			s.mu.Unlock()
		}
	}
	return c, err
}

// from is the addresses connections came from, sorted.
func (s *sources) from() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.seen))
	for ip := range s.seen {
		out = append(out, ip)
	}
	slices.Sort(out)
	return out
}
