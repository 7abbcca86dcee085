package clients

import (
	"context"
	"fmt"
	"maps"
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
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// slotCount is the number of slots of the shards the move test runs: two
// and three shards divide six evenly, and most slots change shard between
// them (I mod 2 against I mod 3).
const slotCount = 6

// TestClientMatrixShardMove runs sharding's two kinds of move under
// running clients of each kind, as the chart's values make them
// (docs/sharding.md). What a user is told to expect, each client must do.
//
// Sharding turned on (sharding.shards from 1 to 2, six slots): the one
// replica stops and two shards start; the old address is slot 0's, served
// by shard 0 (slot 0's Service keeps the chart's Service's name), and the
// clients' scope hashes to slot 3 or 5, shard 1's. Not one RPC fails while
// the scope moves; running, a client keeps the configuration it holds,
// refused by its old address with the new one and given no update;
// restarted on the rewritten bootstrap, it joins its slot and follows every
// change again.
//
// Two shards, then three, of the same six slots: the scope's slot moves
// from shard 1 to shard 0 or 2. Its bootstrap stays byte for byte, and
// each running client, reconnecting to the address it has, reaches the new
// shard and follows the next change without a restart or a failed RPC.
//
// Each slot's address is a listener of its shard's replica, as a slot's
// Service reaches its shard's pods: a connection opened before a change
// stays with the replica it reached until that replica stops, and the next
// one reaches the slot's shard of the new count.
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
	slots := []string{oldAddr}
	for range slotCount - 1 {
		slots = append(slots, freeAddr(t))
	}
	name := movingScope(t, slots)
	key := model.Key{Namespace: ns, Name: name}
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

	// Two shards replace the one replica: shard 0 at the old address, slot
	// 0's, where the running clients reconnect, and the scope's, shard 1,
	// at its slot's.
	const moving = "sharding turned on: the scope moves to its slot's address"
	from := map[string]int{}
	for _, k := range kinds {
		from[k] = clients[k].count()
	}
	stopUnsharded()
	two := startShards(t, env, dir, 2, slots)
	addr := two[0].shards.AddressOf(key)
	testkit.Eventually(t, "the scope's bootstrap rewritten to its slot's address", func() (bool, string) {
		cm := &corev1.ConfigMap{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bootstrap.ConfigMapName(name)}, cm); err != nil {
			return false, err.Error()
		}
		return strings.Contains(cm.Data[bootstrap.GRPCKey], addr), cm.Data[bootstrap.GRPCKey]
	})
	for _, k := range kinds {
		m.recordSteady(t, moving, k, "backend-a while its old address refuses it", clients[k], steadyResults, backend("backend-a"))
	}
	// Each client reconnected to the old address, from its own, and
	// the shard there refused their streams, telling them the new one.
	testkit.Eventually(t, "every client refused by the scope's old address", func() (bool, string) {
		n := two[0].cp.Feedback.Get(model.Key{}).Refused[server.RefusedWrongShard]
		from := two[0].old.from()
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

	// Restarted on the rewritten bootstrap, each joins the scope's slot,
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

	// Three shards replace the two, with the same slots: the scope's slot
	// is another shard's now, at the same address.
	const recount = "two shards, then three, of the same slots: reconnected, no restart"
	before := bootstrapData(t, c, name)
	for _, k := range kinds {
		from[k] = clients[k].count()
	}
	for _, r := range two {
		r.stop()
	}
	three := startShards(t, env, dir, 3, slots)
	owner := three[0].shards.ShardOf(key)
	testkit.Eventually(t, "every client reconnected to the scope's new shard", func() (bool, string) {
		n := len(three[owner].cp.Feedback.Get(key).Proxies)
		return n >= len(kinds), fmt.Sprintf("%d proxies of %s on shard %d of 3", n, key, owner)
	})
	for _, k := range kinds {
		m.recordSteady(t, recount, k, "backend-a, reconnected to the same address", clients[k], steadyResults, backend("backend-a"))
	}
	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{addrB} })
	expect(recount, "then backend-b as the endpoints move, from the new shard", backend("backend-b"))
	for _, k := range kinds {
		m.recordNoFailures(t, recount, k, clients[k], from[k])
	}
	if after := bootstrapData(t, c, name); !maps.Equal(before, after) {
		t.Errorf("the scope's bootstrap ConfigMap changed with the shard count:\n%v\nthen\n%v", before, after)
	}
}

// bootstrapData is the data of the bootstrap ConfigMap of scope name.
func bootstrapData(t *testing.T, c client.Client, name string) map[string]string {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bootstrap.ConfigMapName(name)}, cm); err != nil {
		t.Fatal(err)
	}
	return cm.Data
}

// freeAddr is an address of the host's for a slot: a port the system
// picked, closed again for the slot's shard to listen on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(hostAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// shardReplica is one running replica of a shard.
type shardReplica struct {
	shards shard.Shards
	cp     *controlplane.ControlPlane
	stop   func()
	// old records the connections to slot 0's address, the unsharded
	// replica's, when this replica serves it.
	old *sources
}

// startShards starts one replica of each of count shards over slots, each
// listening on the addresses of its shard's slots.
func startShards(t *testing.T, env *localapi.Env, dir string, count int, slots []string) []*shardReplica {
	t.Helper()
	out := make([]*shardReplica, count)
	for i := range out {
		r := &shardReplica{shards: shard.Shards{Index: i, N: count, Addresses: slots}}
		var ls []net.Listener
		for j, a := range slots {
			if j%count != i {
				continue
			}
			l := listenAgain(t, a)
			if j == 0 {
				r.old = &sources{Listener: l, seen: map[string]bool{}}
				l = r.old
			}
			ls = append(ls, l)
		}
		r.cp, r.stop = startReplica(t, env, dir, joinListeners(ls), r.shards)
		out[i] = r
	}
	return out
}

// listenAgain listens on addr, which a replica that just stopped listened
// on: until its listener is closed, the address may still be taken.
func listenAgain(t *testing.T, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	testkit.Eventually(t, "listening on "+addr, func() (bool, string) {
		var err error
		l, err = net.Listen("tcp", addr)
		return err == nil, fmt.Sprint(err)
	})
	return l
}

// movingScope is the name of a scope of the client matrix's namespace
// whose slot, of slots, is shard 1's of two and another's of three, so
// that turning sharding on moves it away from the old address and three
// shards move it again.
func movingScope(t *testing.T, slots []string) string {
	two, three := shard.Shards{N: 2, Addresses: slots}, shard.Shards{N: 3, Addresses: slots}
	for i := range 64 {
		k := model.Key{Namespace: ns, Name: fmt.Sprintf("moving-%d", i)}
		if two.ShardOf(k) == 1 && three.ShardOf(k) != 1 {
			return k.Name
		}
	}
	t.Fatal("no scope name of 64 is shard 1's of two and another's of three")
	return ""
}

// listeners is one replica's listener on several addresses, as the
// Services of its shard's slots reach its pod: a connection to any of them
// is the replica's.
type listeners struct {
	ls    []net.Listener
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func joinListeners(ls []net.Listener) *listeners {
	j := &listeners{ls: ls, conns: make(chan net.Conn), done: make(chan struct{})}
	for _, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				select {
				case j.conns <- c:
				case <-j.done:
					_ = c.Close()
					return
				}
			}
		}()
	}
	return j
}

func (j *listeners) Accept() (net.Conn, error) {
	select {
	case c := <-j.conns:
		return c, nil
	case <-j.done:
		return nil, net.ErrClosed
	}
}

func (j *listeners) Close() error {
	j.once.Do(func() {
		close(j.done)
		for _, l := range j.ls {
			_ = l.Close()
		}
	})
	return nil
}

func (j *listeners) Addr() net.Addr { return j.ls[0].Addr() }

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
