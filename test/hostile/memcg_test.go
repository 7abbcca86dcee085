package hostile

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// The chart's container: a 512 MiB memory limit, and the Go memory limit
// the binary derives from it (memlimit.go: 90% of SCOPEPLANE_MEMORY_LIMIT),
// given to the confined server as GOMEMLIMIT.
const (
	chartMemoryLimit = 512 << 20
	chartGoMemLimit  = chartMemoryLimit * 9 / 10
)

// serveEnv makes a child process of the test binary the confined server
// (TestConfinedServer).
const serveEnv = "SCOPEPLANE_HOSTILE_SERVE"

// memoryCgroup makes a cgroup v1 memory cgroup limited to limit bytes,
// without swap, removed when the test ends. The test is skipped where
// there is none to make: not root, or no cgroup v1 memory controller.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	const root = "/sys/fs/cgroup/memory"
	if os.Geteuid() != 0 {
		t.Skip("confining the server in a memory cgroup needs root")
	}
	if _, err := os.Stat(filepath.Join(root, "memory.limit_in_bytes")); err != nil {
		t.Skipf("no cgroup v1 memory controller at %s: %v", root, err)
	}
	dir := filepath.Join(root, fmt.Sprintf("scopeplane-hostile-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The cgroup can be removed once its processes are gone.
		testkit.Eventually(t, "the memory cgroup removed", func() (bool, string) {
			err := os.Remove(dir)
			return err == nil || errors.Is(err, os.ErrNotExist), fmt.Sprint(err)
		})
	})
	cgroupWrite(t, dir, "memory.limit_in_bytes", strconv.FormatInt(limit, 10))
	cgroupWrite(t, dir, "memory.swappiness", "0")
	return dir
}

func cgroupWrite(t *testing.T, dir, file, value string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
}

// cgroupRead reads a counter of the cgroup; in memory.oom_control, the
// value of the key after the file's name (such as "oom_kill").
func cgroupRead(t *testing.T, dir, file string) int64 {
	t.Helper()
	name, key, _ := strings.Cut(file, ":")
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.TrimSpace(string(b))
	if key != "" {
		for _, line := range strings.Split(text, "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == key {
				text = v
			}
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		t.Fatalf("%s in %s: %v", file, dir, err)
	}
	return n
}

// confined is the server running in a child process inside the cgroup,
// and a legitimate proxy connected to it from the start.
type confined struct {
	t      *testing.T
	cgroup string
	addr   string
	cmd    *exec.Cmd
	stdin  io.Writer
	exited chan error
	proxy  *adsclient.Client
	pushes int
}

// startConfined starts the server in a child process, moves it into the
// cgroup before it builds anything, and returns once it serves. The
// profile names how the server authenticates (confinedProfile).
func startConfined(t *testing.T, cgroup, profile string) *confined {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestConfinedServer$", "-test.v")
	cmd.Env = append(os.Environ(), serveEnv+"="+profile, fmt.Sprintf("GOMEMLIMIT=%d", chartGoMemLimit))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &confined{t: t, cgroup: cgroup, cmd: cmd, stdin: stdin, exited: make(chan error, 1)}
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case err := <-c.exited:
			t.Logf("the confined server ended: %v", err)
		case <-time.After(testkit.Timeout):
			_ = cmd.Process.Kill()
			t.Logf("the confined server was killed at cleanup: %v", <-c.exited)
		}
	})
	cgroupWrite(t, cgroup, "cgroup.procs", strconv.Itoa(cmd.Process.Pid))
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
				addr <- a
			}
		}
		c.exited <- cmd.Wait()
	}()
	select {
	case c.addr = <-addr:
	case err := <-c.exited:
		t.Fatalf("the confined server exited before serving: %v", err)
	case <-time.After(testkit.Timeout):
		t.Fatal("the confined server did not start serving")
	}
	conn := c.dial()
	t.Cleanup(func() { _ = conn.Close() })
	cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node("legitimate", "default/sotw"))
	cfg.RecordEvents = false
	c.proxy = adsclient.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.proxy.Run(ctx, conn) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// dial is a connection from the legitimate address.
func (c *confined) dial() *grpc.ClientConn {
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(from(legitimate)))
	if err != nil {
		c.t.Fatal(err)
	}
	return conn
}

// push has the server add a Service and returns how long the connected
// proxy took to hold its cluster.
func (c *confined) push(row string) time.Duration {
	c.t.Helper()
	c.pushes++
	name := fmt.Sprintf("push-%02d", c.pushes)
	start := time.Now()
	if _, err := fmt.Fprintf(c.stdin, "push %s\n", name); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	cluster := "default/" + name + ":80"
	if err := c.proxy.WaitFor(ctx, func(px *adsclient.Client) bool {
		_, ok := px.State(xdstype.Cluster.URL())[cluster]
		return ok
	}); err != nil {
		c.t.Fatalf("%s: the connected proxy did not get %s: %v (stream: %v)", row, cluster, err, c.proxy.Err())
	}
	return time.Since(start)
}

// hold has the server hold mib MiB of live heap of its own, in place of
// what it held for the previous hold.
func (c *confined) hold(mib int) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.stdin, "hold %d\n", mib); err != nil {
		c.t.Fatal(err)
	}
}

// alive fails the test when the server exited (the OOM killer's SIGKILL
// included) or the cgroup counts an OOM kill.
func (c *confined) alive(row string) {
	c.t.Helper()
	select {
	case err := <-c.exited:
		c.exited <- err
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
			c.t.Fatalf("%s: the server was killed (SIGKILL; OOM kills in its cgroup: %d)", row, cgroupRead(c.t, c.cgroup, "memory.oom_control:oom_kill"))
		}
		c.t.Fatalf("%s: the server exited: %v", row, err)
	default:
	}
	if n := cgroupRead(c.t, c.cgroup, "memory.oom_control:oom_kill"); n > 0 {
		c.t.Fatalf("%s: the cgroup counts %d OOM kills", row, n)
	}
}

// join connects a new wildcard SotW proxy from the legitimate address
// (joinWithin), and fails the test unless it joined within testkit.Timeout.
func (c *confined) join(row string) time.Duration {
	c.t.Helper()
	took, err := c.joinWithin(testkit.Timeout)
	if err != nil {
		c.t.Fatalf("%s: %v", row, err)
	}
	return took
}

// joinWithin connects a new wildcard SotW proxy from the legitimate
// address, as a proxy does, reconnecting when its connection is closed (a
// full replica closes new connections it cannot make room for), and
// returns how long it took to hold every cluster, or why it did not within
// bound.
func (c *confined) joinWithin(bound time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	for {
		conn := c.dial()
		cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node("joining", "default/sotw"))
		cfg.RecordEvents = false
		px := adsclient.New(cfg)
		attempt, stop := context.WithCancel(ctx)
		ended := make(chan struct{})
		go func() { defer close(ended); _ = px.Run(attempt, conn) }()
		err := px.WaitFor(attempt, func(px *adsclient.Client) bool {
			return len(px.State(xdstype.Cluster.URL())) >= services || px.Err() != nil
		})
		joined := len(px.State(xdstype.Cluster.URL())) >= services
		stop()
		<-ended
		_ = conn.Close()
		if joined {
			return time.Since(start), nil
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("a legitimate proxy did not join: %w (stream: %w)", err, px.Err())
		}
		time.Sleep(time.Second) // gRPC's first reconnect backoff
	}
}

// TestUnderTheChartsMemoryLimit replays, against the server confined as
// the chart confines the operator's container (512 MiB, GOMEMLIMIT at 90%
// of it), the attacks that OOM-killed a replica: idle connections from many
// addresses, 15 MiB request headers, delta streams claiming made-up names
// and never reading, and the NACK flood of one client and of ten. The
// server must survive each, with no OOM kill in its cgroup, a new proxy
// must join, and the proxy connected before must be pushed to: during
// the idle connections, after the other attacks (which hold nothing once
// refused or done). The table gives the cgroup's peak usage (what the OOM
// killer weighs: resident memory and page cache) per row.
func TestUnderTheChartsMemoryLimit(t *testing.T) {
	cg := memoryCgroup(t, chartMemoryLimit)
	c := startConfined(t, cg, anonymousProfile)
	c.push("before the attacks")
	base := cgroupRead(t, cg, "memory.usage_in_bytes")
	var table strings.Builder
	fmt.Fprintf(&table, "\n| attack | ended | cgroup peak (limit %d MiB; %.1f MiB serving before) | join | push |\n|---|---|---|---|---|\n",
		chartMemoryLimit>>20, float64(base)/(1<<20))
	// row runs an attack, which returns how it ended and a function that
	// ends what it holds, called after the join and push.
	row := func(name string, run func() (ended string, stop func())) {
		t.Helper()
		cgroupWrite(t, cg, "memory.max_usage_in_bytes", "0")
		ended, stop := run()
		c.alive(name)
		join, push := c.join(name), c.push(name)
		stop()
		c.alive(name)
		peak := cgroupRead(t, cg, "memory.max_usage_in_bytes")
		fmt.Fprintf(&table, "| %s | %s | %.1f MiB | %s | %s |\n", name, ended, float64(peak)/(1<<20), join.Round(time.Millisecond), push.Round(time.Millisecond))
	}
	row("5,500 idle connections from 11 addresses", func() (string, func()) {
		served := idleConnections(t, c.addr, 11, 500)
		return fmt.Sprintf("%d served", len(served)), func() {
			for _, conn := range served {
				_ = conn.Close()
			}
		}
	})
	row("300 streams with a 15 MiB authorization header", func() (string, func()) {
		o := headerFlood(t, c.addr, headerBlock(c.addr), 300)
		if o.codes[codes.ResourceExhausted] != 300 {
			t.Errorf("the header flood ended %s (%q), want each reset", o.String(), o.msgs)
		}
		return o.String(), func() {}
	})
	row("20 delta streams claiming 75k made-up names, never reading", func() (string, func()) {
		attack(t, c.addr, "claims-answered")(false)
		return "answered, unread", func() {}
	})
	row("300 streams of one client NACKing with 1 MiB", func() (string, func()) {
		attack(t, c.addr, "nacks")(false)
		return fmt.Sprintf("OK×%d, ClientStreamLimit×%d", nackAdmitted(1), nackStreams-nackAdmitted(1)), func() {}
	})
	row("300 streams of ten clients NACKing with 1 MiB", func() (string, func()) {
		attack(t, c.addr, "nacks-spread")(false)
		return fmt.Sprintf("OK×%d at most: beyond the memory budget, the newest ended", nackAdmitted(len(spreadFrom))), func() {}
	})
	t.Log(table.String())
}

// The profiles of the confined server: anonymous proxies admitted, as in
// the other rows, or the chart's peer-address method (peerAddressOptions).
const (
	anonymousProfile   = "anonymous"
	peerAddressProfile = "peer-address"
)

// TestConfinedServer is the server side of TestUnderTheChartsMemoryLimit,
// run in a child process; it does nothing when run otherwise. It waits for
// a line on its input (sent once it is in the cgroup), serves the hostile
// suite's world with the production limits (and the authentication of its
// profile), prints its address, and serves until its input
// closes, adding a Service for each "push <name>" line.
func TestConfinedServer(t *testing.T) {
	if os.Getenv(serveEnv) == "" {
		return
	}
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	opts := server.Options{Authenticator: &auth.Authenticator{AllowAnonymous: true}}
	profile := os.Getenv(serveEnv)
	peer := profile == peerAddressProfile || profile == fastSendProfile || profile == slowSendProfile
	if peer {
		opts = peerAddressOptions(profile)
	}
	p := pipeline.New(pipeline.Options{Server: opts})
	for i := range services {
		p.Catalog.UpsertService(testkit.Service("default", fmt.Sprintf("svc-%04d", i), "10.0.0.1", "10.0.0.2"))
	}
	for name, proto := range map[string]model.Protocol{"sotw": model.SotW, "delta": model.Delta} {
		sc := scope(name, proto)
		sc.AdmitByPeerAddress = peer
		p.Catalog.UpsertScope(sc)
	}
	p.Sync()
	fmt.Printf("ADDR %s\n", serve(t, p))
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return
		}
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "push "); ok {
			p.Catalog.UpsertService(testkit.Service("default", name, "10.0.1.1"))
			p.Sync()
		}
		if mib, ok := strings.CutPrefix(strings.TrimSpace(line), "hold "); ok {
			n, err := strconv.Atoi(mib)
			if err != nil {
				t.Fatal(err)
			}
			held = hold(n)
		}
	}
}

// held is what the confined server holds for a "hold <MiB>" line.
var held [][]byte

// hold allocates mib MiB that stay live, every page written so that they
// are resident: the heap a replica holds of its own, as a world that grew
// after the first build does.
func hold(mib int) [][]byte {
	h := make([][]byte, mib)
	for i := range h {
		h[i] = make([]byte, 1<<20)
		for j := 0; j < len(h[i]); j += 4096 {
			h[i][j] = 1
		}
	}
	return h
}
