// Command demo is `make demo`: scopeplane end to end on this machine. It
// starts a local kube-apiserver and etcd, installs the CRD, runs the
// operator in-process, starts real gRPC backends on 127.0.0.1 and publishes
// them as Services and EndpointSlices, applies a SotW ProxylessGRPC scope
// and a Delta Envoy scope with kubectl, routes RPCs through the SotW scope
// with grpc-go's own xDS client (bootstrapped from the scope's ConfigMap),
// follows the Delta scope with the project's delta client acting as an Envoy
// (gRPC clients speak SotW only, so a delta scope is for Envoy), moves an
// endpoint and
// shows traffic moving, and prints the scopes and their conditions.
//
// With DEMO_ONCE=1 it runs one pass and exits 0 only if every RPC and every
// condition was as expected; otherwise it keeps everything running until
// Ctrl-C so that kubectl can be pointed at it.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/types/known/structpb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// callCredsEnv turns on grpc-go's bootstrap call_creds (gRFC A97), which
// carry the ServiceAccount token. grpc-go reads it when it is loaded, so
// the demo sets it by starting itself again, as a pod spec's env would.
const callCredsEnv = "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS"

func main() {
	if os.Getenv(callCredsEnv) != "true" {
		exe, err := os.Executable()
		if err == nil {
			err = syscall.Exec(exe, os.Args, append(os.Environ(), callCredsEnv+"=true"))
		}
		fmt.Fprintln(os.Stderr, "demo: starting with", callCredsEnv+"=true:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "\ndemo failed:", err)
		os.Exit(1)
	}
}

type demo struct {
	env        *localapi.Env
	kubeconfig string
	admin      string // the operator's admin (CSDS) address
	mount      string // where the demo's "pods" mount their bootstrap ConfigMaps
	backends   map[string]*whoami.Backend
	tokens     map[string]string // ServiceAccount tokens by ServiceAccount name
}

// tokenAudience is the audience the operator requires (--xds-token-audience).
const tokenAudience = "scopeplane"

// token creates ServiceAccount demo/name and returns a TokenRequest token
// for the operator's audience: what a pod's projected volume would hold.
func (d *demo) token(ctx context.Context, name string) (string, error) {
	if err := d.env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name}}); err != nil {
		return "", err
	}
	cs, err := kubernetes.NewForConfig(d.env.Config)
	if err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts("demo").CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{tokenAudience}, ExpirationSeconds: ptr.To(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for demo/%s: %w", name, err)
	}
	fmt.Printf("    demo/%s: token for audience %s, valid until %s\n", name, tokenAudience, tr.Status.ExpirationTimestamp.UTC().Format(time.RFC3339))
	return tr.Status.Token, nil
}

func run(ctx context.Context) error {
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel))) // errors only: the demo narrates the rest
	step("starting a local kube-apiserver and etcd with the ProxyScope CRD installed")
	env, err := localapi.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	dir, err := os.MkdirTemp("", "scopeplane-demo-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	d := &demo{env: env, kubeconfig: filepath.Join(dir, "kubeconfig"), mount: filepath.Join(dir, "xds"), backends: map[string]*whoami.Backend{}}
	if err := os.Mkdir(d.mount, 0o700); err != nil {
		return err
	}
	if err := env.WriteKubeconfig(d.kubeconfig); err != nil {
		return err
	}

	step("starting the operator: reconcilers, snapshot builder, ADS server (SotW and delta)")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme.Scheme, Cache: controlplane.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		return err
	}
	mgrCtx, cancelMgr := context.WithCancel(ctx)
	defer cancelMgr()
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	d.admin = admin.Addr().String()
	// xDS is served over TLS from a CA the operator creates in its own
	// namespace, as a default install does.
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "scopeplane-system"}}); err != nil {
		return err
	}
	authn, err := auth.Config{Methods: "token", Audience: tokenAudience}.Build(env.Config)
	if err != nil {
		return err
	}
	if _, err := controlplane.Setup(mgrCtx, mgr, controlplane.Options{
		TLS:                controlplane.TLS{Secret: types.NamespacedName{Namespace: "scopeplane-system", Name: "scopeplane-xds-tls"}},
		BootstrapMountPath: d.mount,
		XDSListener:        lis, XDSServerAddress: lis.Addr().String(), CoalesceWindow: 10 * time.Millisecond, StatusWindow: 100 * time.Millisecond,
		AdminListener: admin,
		// Proxies authenticate with ServiceAccount tokens, as a default
		// install requires.
		Server: server.Options{Authenticator: authn},
		// Second-wide cost buckets, so that the demo's minute shows the
		// figures a minute-wide bucket shows over an hour.
		CostBucket: time.Second,
	}); err != nil {
		return err
	}
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	defer func() {
		cancelMgr()
		if err := <-mgrDone; err != nil {
			fmt.Fprintln(os.Stderr, "operator:", err)
		}
	}()
	fmt.Printf("    ADS server on %s over TLS (CA and certificate in Secret scopeplane-system/scopeplane-xds-tls), admin (CSDS) on %s\n", lis.Addr(), d.admin)

	step("starting gRPC backends on 127.0.0.1")
	for _, name := range []string{"greeter-a", "greeter-b", "inventory-a"} {
		b, err := whoami.Start(name)
		if err != nil {
			return err
		}
		defer b.Stop()
		d.backends[name] = b
		fmt.Printf("    %-12s 127.0.0.1:%d\n", name, b.Port)
	}

	step("kubectl apply: namespace demo, Services greeter and inventory with their EndpointSlices")
	fmt.Printf("    (the API server refuses loopback addresses in EndpointSlices, so they list %s;\n     the demo's clients deliver that address to 127.0.0.1)\n", whoami.SliceAddress)
	if _, err := d.kubectl(d.world("greeter-a"), "apply", "-f", "-"); err != nil {
		return err
	}

	step("ServiceAccounts demo/greeter-client and demo/shop-envoy, each with a TokenRequest token (audience scopeplane), as a projected volume holds")
	tokens := map[string]string{}
	for _, sa := range []string{"greeter-client", "shop-envoy"} {
		if tokens[sa], err = d.token(ctx, sa); err != nil {
			return err
		}
	}
	d.tokens = tokens

	step("kubectl apply: scope demo/greeter (SotW, ProxylessGRPC) and demo/shop (Delta, Envoy: gRPC clients speak SotW only)")
	if _, err := d.kubectl(scopes, "apply", "-f", "-"); err != nil {
		return err
	}

	step("grpc-go's xDS client joins demo/greeter with the bootstrap from its ConfigMap")
	grpcBootstrap, err := d.bootstrapOf(ctx, "greeter", bootstrap.GRPCKey)
	if err != nil {
		return err
	}
	// What the kubelet does with the pod's projected token volume: the
	// bootstrap names the token's file, here in the demo's mount.
	tokenFile := filepath.Join(d.mount, "greeter-client.token")
	if err := os.WriteFile(tokenFile, []byte(tokens["greeter-client"]), 0o600); err != nil {
		return err
	}
	if !bytes.Contains(grpcBootstrap, []byte(bootstrap.TokenPath)) {
		return fmt.Errorf("the gRPC bootstrap names no token file %s", bootstrap.TokenPath)
	}
	grpcBootstrap = bytes.ReplaceAll(grpcBootstrap, []byte(bootstrap.TokenPath), []byte(tokenFile))
	fmt.Printf("    (the token of demo/greeter-client at %s, where the projected volume would mount it)\n", tokenFile)
	fmt.Print(indent(string(grpcBootstrap)))
	resolver, err := xds.NewXDSResolverWithConfigForTesting(grpcBootstrap)
	if err != nil {
		return err
	}
	target := "xds:///greeter.demo.svc.cluster.local:50051"
	conn, err := grpc.NewClient(target, grpc.WithResolvers(resolver),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(whoami.Dialer))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	if err := calls(ctx, conn, target, "greeter-a"); err != nil {
		return err
	}

	step("the project's delta client joins demo/shop as an Envoy would, with the Envoy bootstrap's node")
	deltaClient, deltaDone, err := d.deltaProxy(ctx, lis.Addr().String())
	if err != nil {
		return err
	}
	if err := waitFor(ctx, deltaClient, "the delta client holds both Services", func(c *adsclient.Client) bool {
		return len(c.State(xdstype.Cluster.URL())) == 2 && len(c.State(xdstype.Listener.URL())) == 1 && len(c.State(xdstype.Route.URL())) == 1
	}); err != nil {
		return err
	}
	printDelta(deltaClient)

	beforeMove := deltaClient.Stats()
	step("kubectl patch: greeter's endpoint moves from greeter-a to greeter-b")
	patch := fmt.Sprintf(`{"ports":[{"name":"grpc","port":%d,"protocol":"TCP"}]}`, d.backends["greeter-b"].Port)
	if _, err := d.kubectl("", "-n", "demo", "patch", "endpointslice", "greeter-1", "--type=merge", "-p", patch); err != nil {
		return err
	}
	if err := calls(ctx, conn, target, "greeter-b"); err != nil {
		return err
	}
	want := fmt.Sprintf("port_value:%d", d.backends["greeter-b"].Port)
	if err := waitFor(ctx, deltaClient, "the delta client sees the new endpoint", func(c *adsclient.Client) bool {
		return strings.Contains(strings.ReplaceAll(c.State(xdstype.Endpoint.URL())["demo/greeter:50051"].Resource.String(), " ", ""), want)
	}); err != nil {
		return err
	}
	st := deltaClient.Stats()
	fmt.Printf("    the move cost the delta client %d response(s) carrying %d resource(s), %d bytes\n",
		st.Responses-beforeMove.Responses, st.Resources-beforeMove.Resources, st.Bytes-beforeMove.Bytes)
	printDelta(deltaClient)

	step("endpoint churn: greeter's endpoint flips between greeter-a and greeter-b 10 times")
	for i := range 10 {
		to := []string{"greeter-a", "greeter-b"}[i%2]
		if err := d.moveGreeter(ctx, to); err != nil {
			return err
		}
		// Apart by more than the builder's widest coalescing window, so
		// that each flip is a version of its own: the cost advice below
		// needs ten pushes.
		time.Sleep(150 * time.Millisecond)
	}
	if err := calls(ctx, conn, target, "greeter-b"); err != nil {
		return err
	}

	step("kubectl wait --for=condition=Ready: every connected proxy ACKed the current version")
	if _, err := d.kubectl("", "-n", "demo", "wait", "--for=condition=Ready", "proxyscope/greeter", "proxyscope/shop", "--timeout=30s"); err != nil {
		return err
	}

	step("kubectl get ps -A -o wide")
	if _, err := d.kubectl("", "get", "ps", "-A", "-o", "wide"); err != nil {
		return err
	}
	step("conditions")
	out, err := d.kubectl("", "get", "ps", "-n", "demo", "-o", "go-template", "--template", conditionsTemplate)
	if err != nil {
		return err
	}
	if strings.Count(out, "Ready=True") != 2 || strings.Count(out, "Accepted=True") != 2 || strings.Count(out, "Degraded=False") != 2 {
		return errors.New("the scopes' conditions are not Accepted=True, Ready=True, Degraded=False")
	}

	step("what each scope sent, and what the other protocol would have sent (status.cost; the demo's buckets are 1 s, a minute in production)")
	if err := d.waitAdvice(ctx); err != nil {
		return err
	}
	if _, err = d.kubectl("", "get", "ps", "-n", "demo", "-o", "wide"); err != nil {
		return err
	}
	if _, err = d.kubectl("", "get", "ps", "-n", "demo", "-o", "jsonpath", "--template", adviceTemplate); err != nil {
		return err
	}

	step("kubectl scopeplane proxy-status: every proxy, per type, against what its scope serves (CSDS)")
	if out, err = d.kubectl("", "scopeplane", "proxy-status", "--address", d.admin); err != nil {
		return err
	}
	if strings.Count(out, "SYNCED  SYNCED  SYNCED  SYNCED") != 2 {
		return errors.New("kubectl scopeplane proxy-status does not show both proxies in sync")
	}
	step("kubectl scopeplane explain: why the gRPC client of demo/greeter holds greeter but not inventory")
	for _, svc := range []string{"demo/greeter", "demo/inventory"} {
		if _, err = d.kubectl("", "scopeplane", "explain", "greeter-grpc", svc, "--address", d.admin); err != nil {
			return err
		}
	}

	if os.Getenv("DEMO_ONCE") != "" {
		step("demo passed: every RPC and every condition as expected")
		return nil
	}
	step("everything keeps running; in another shell:")
	fmt.Printf("    export KUBECONFIG=%s PATH=%s\n    kubectl get ps -A -o wide\n    kubectl describe ps -n demo greeter\n    kubectl scopeplane proxy-status --address %s\n    kubectl scopeplane config-dump demo/greeter --type clusters --address %s\n\nPress Ctrl-C to stop.\n",
		d.kubeconfig, os.Getenv("PATH"), d.admin, d.admin)
	select {
	case <-ctx.Done():
	case err := <-deltaDone:
		return fmt.Errorf("the delta client stopped: %w", err)
	}
	return nil
}

func (d *demo) kubectl(stdin string, args ...string) (string, error) {
	fmt.Printf("    $ kubectl %s\n", strings.Join(args, " "))
	cmd := exec.Command("kubectl", args...)
	// Through the environment: kubectl refuses flags before a plugin's name.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+d.kubeconfig)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	fmt.Print(indent(out.String()))
	if err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}

var worldTemplate = template.Must(template.New("world").Parse(`apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Service
metadata: {name: greeter, namespace: demo, labels: {app: greeter}}
spec:
  ports: [{name: grpc, port: 50051, appProtocol: grpc}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: greeter-1, namespace: demo, labels: {kubernetes.io/service-name: greeter}}
addressType: IPv4
ports: [{name: grpc, port: {{.Greeter}}, protocol: TCP}]
endpoints: [{addresses: ["{{.Address}}"], conditions: {ready: true}, zone: zone-a}]
---
apiVersion: v1
kind: Service
metadata: {name: inventory, namespace: demo, labels: {app: inventory}}
spec:
  ports: [{name: grpc, port: 50051, appProtocol: grpc}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: inventory-1, namespace: demo, labels: {kubernetes.io/service-name: inventory}}
addressType: IPv4
ports: [{name: grpc, port: {{.Inventory}}, protocol: TCP}]
endpoints: [{addresses: ["{{.Address}}"], conditions: {ready: true}, zone: zone-a}]
`))

func (d *demo) world(greeter string) string {
	var b strings.Builder
	_ = worldTemplate.Execute(&b, map[string]any{
		"Greeter": d.backends[greeter].Port, "Inventory": d.backends["inventory-a"].Port, "Address": whoami.SliceAddress,
	})
	return b.String()
}

const scopes = `apiVersion: xds.scopeplane.dev/v1alpha1
kind: ProxyScope
metadata: {name: greeter, namespace: demo}
spec:
  protocol: SotW
  services: [{names: [greeter]}]
  listener: {mode: ProxylessGRPC}
---
apiVersion: xds.scopeplane.dev/v1alpha1
kind: ProxyScope
metadata: {name: shop, namespace: demo}
spec:
  protocol: Delta
  services: [{selector: {}}]
  listener: {mode: Envoy, port: 10080, virtualHosts: VHDS}
`

const adviceTemplate = `{range .items[*]}{.metadata.name}: {.status.cost.recommendation}: {.status.cost.advice}{"\n"}{end}`

// moveGreeter points greeter's EndpointSlice at a backend, as the patch
// step does, through the API client.
func (d *demo) moveGreeter(ctx context.Context, backend string) error {
	es := &discoveryv1.EndpointSlice{}
	if err := d.env.Client.Get(ctx, client.ObjectKey{Namespace: "demo", Name: "greeter-1"}, es); err != nil {
		return err
	}
	port := int32(d.backends[backend].Port)
	es.Ports[0].Port = &port
	return d.env.Client.Update(ctx, es)
}

// waitAdvice waits until both scopes' cost window is long enough to advise.
func (d *demo) waitAdvice(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var list xdsv1alpha1.ProxyScopeList
		err := d.env.Client.List(ctx, &list, client.InNamespace("demo"))
		advised := err == nil && len(list.Items) == 2
		for _, ps := range list.Items {
			advised = advised && ps.Status.Cost != nil && ps.Status.Cost.Recommendation != xdsv1alpha1.RecommendationNotEnoughData
		}
		if advised {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("the scopes' cost advice: %w", err)
			}
			return fmt.Errorf("the scopes' cost advice: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

const conditionsTemplate = `{{range .items}}{{.metadata.namespace}}/{{.metadata.name}}:{{"\n"}}{{range .status.conditions}}  {{.type}}={{.status}} ({{.reason}}): {{.message}}{{"\n"}}{{end}}{{end}}`

// bootstrapOf waits for the scope's bootstrap ConfigMap and returns one key.
func (d *demo) bootstrapOf(ctx context.Context, scope, key string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		cm := &corev1.ConfigMap{}
		err := d.env.Client.Get(ctx, client.ObjectKey{Namespace: "demo", Name: bootstrap.ConfigMapName(scope)}, cm)
		if err == nil && cm.Data[key] != "" && cm.Data[bootstrap.CAKey] != "" {
			// What the kubelet does with the pod's ConfigMap volume: the
			// bootstraps name the CA bundle's file in it.
			if err := os.WriteFile(filepath.Join(d.mount, bootstrap.CAKey), []byte(cm.Data[bootstrap.CAKey]), 0o600); err != nil {
				return nil, err
			}
			fmt.Printf("    ConfigMap demo/%s, key %s (and %s, mounted at %s):\n", cm.Name, key, bootstrap.CAKey, d.mount)
			return []byte(cm.Data[key]), nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the bootstrap ConfigMap of %s did not appear (last read: %w)", scope, errors.Join(err, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// deltaProxy runs the project's delta client as an Envoy of the scope: with
// the node of the scope's Envoy bootstrap, subscribed to everything.
func (d *demo) deltaProxy(ctx context.Context, server string) (*adsclient.Client, <-chan error, error) {
	raw, err := d.bootstrapOf(ctx, "shop", bootstrap.EnvoyKey)
	if err != nil {
		return nil, nil, err
	}
	var b struct {
		Node struct {
			ID       string            `json:"id"`
			Metadata map[string]string `json:"metadata"`
		} `json:"node"`
	}
	if err := yaml.Unmarshal(raw, &b); err != nil {
		return nil, nil, err
	}
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range b.Node.Metadata {
		meta.Fields[k] = structpb.NewStringValue(v)
	}
	fmt.Printf("    node %q with metadata %v, over DELTA_GRPC\n", b.Node.ID, b.Node.Metadata)
	types := xdstype.URLs()
	c := adsclient.New(adsclient.Config{
		Protocol: adsclient.Delta, Node: &corev3.Node{Id: b.Node.ID, Metadata: meta}, Types: types, Validate: true,
		Wildcard: map[string]bool{types[0]: true, types[1]: true, types[2]: true, types[3]: true},
	})
	// TLS as the Envoy bootstrap's xDS cluster has it: the CA file from the
	// ConfigMap, TLS 1.2 or later.
	ca, err := os.ReadFile(filepath.Join(d.mount, bootstrap.CAKey))
	if err != nil {
		return nil, nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, nil, errors.New("the bootstrap ConfigMap's ca.crt holds no certificate")
	}
	conn, err := grpc.NewClient(server, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})))
	if err != nil {
		return nil, nil, err
	}
	// The token as the bootstrap's credential injector makes Envoy send it.
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+d.tokens["shop-envoy"])
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, conn); _ = conn.Close() }()
	return c, done, nil
}

func printDelta(c *adsclient.Client) {
	for name, h := range c.State(xdstype.Endpoint.URL()) {
		cla, err := adsclient.Decode[*endpointv3.ClusterLoadAssignment](h)
		if err != nil {
			continue
		}
		var eps []string
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				eps = append(eps, fmt.Sprintf("%s:%d %s", sa.GetAddress(), sa.GetPortValue(), e.GetHealthStatus()))
			}
		}
		fmt.Printf("    %-22s version %s  %v\n", name, h.Version, eps)
	}
}

// calls makes RPCs until five in a row reach want.
func calls(ctx context.Context, conn *grpc.ClientConn, target, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	streak := 0
	var last string
	for streak < 5 {
		callCtx, cancelCall := context.WithTimeout(ctx, 2*time.Second)
		got, err := whoami.Call(callCtx, conn)
		cancelCall()
		switch {
		case err == nil && got == want:
			streak++
			fmt.Printf("    RPC %s → %s\n", target, got)
		case err != nil:
			streak, last = 0, err.Error()
		default:
			streak, last = 0, "answered by "+got
		}
		if ctx.Err() != nil {
			return fmt.Errorf("RPCs to %s never reached %s; last: %s", target, want, last)
		}
		// Apart by more than the builder's widest coalescing window, so
		// that each flip is a version of its own: the cost advice below
		// needs ten pushes.
		time.Sleep(150 * time.Millisecond)
	}
	return nil
}

func waitFor(ctx context.Context, c *adsclient.Client, what string, cond func(*adsclient.Client) bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitFor(ctx, cond); err != nil {
		return fmt.Errorf("%s: %w", what, errors.Join(err, c.Err()))
	}
	return nil
}

func step(msg string) { fmt.Printf("\n==> %s\n", msg) }

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
