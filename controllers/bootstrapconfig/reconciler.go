// Package bootstrapconfig writes, for every ProxyScope, the ConfigMap that
// holds the bootstraps its proxies mount (rendered by package xds/bootstrap).
// It runs on the leader only; it is an output of the control plane, like
// the status, and feeds nothing back into the pipeline.
package bootstrapconfig

import (
	"cmp"
	"context"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/keyset"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// ManagedByLabel marks the objects scopeplane writes; the manager caches
// only ConfigMaps that carry it.
const ManagedByLabel = "app.kubernetes.io/managed-by"

// ManagedBy is the value of ManagedByLabel on scopeplane's objects.
const ManagedBy = "scopeplane"

// Reconciler writes, for every ProxyScope, a ConfigMap holding an
// Envoy bootstrap and a gRPC xDS bootstrap that join the scope. The
// ConfigMap is owned by the ProxyScope, so it is garbage-collected with it,
// and rewritten when the protocol changes. It runs on the leader only.
type Reconciler struct {
	Client client.Client
	// APIReader reads from the API server, not the cache: what a create
	// finds in the way, which the cache may not show yet (nil: Client).
	APIReader client.Reader
	// XDSServer is the host:port proxies dial to reach the ADS server,
	// unsharded.
	XDSServer string
	// Shards is this replica's shard: the leader of each shard writes the
	// ConfigMaps of its shard's scopes only, each naming its scope's
	// slot's address.
	Shards shard.Shards
	// Recorder, when set, records an Event on a scope whose bootstrap is
	// rewritten to name another xDS address (ShardMoved): with shards, the
	// scope's slot has another address than when it was written (sharding
	// turned on, or another number of slots), and its running proxies,
	// which read the old bootstrap, follow only once restarted.
	Recorder events.EventRecorder
	// Started is when this replica started. While the slots change,
	// replicas of both layouts run, and a scope whose address changes has
	// a leader of each: a ConfigMap written under another number of slots
	// by a replica started later is left as it is for a while (see
	// deferral), so that the newest layout's bootstrap stands instead of
	// the two leaders rewriting it in turn.
	Started time.Time
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Conflicts records the scopes whose ConfigMap name is taken, for the
	// status.
	Conflicts *Conflicts
	// CA is the CA bundle proxies verify the xDS server with, written
	// into every ConfigMap (key ca.crt) and named by its bootstraps; nil
	// when the xDS port is plaintext. Every ConfigMap is rewritten when
	// the bundle changes.
	CA CABundle
	// MountPath is where pods mount the ConfigMap (bootstrap.MountPath
	// when empty), so the bootstraps can name the CA file in it.
	MountPath string
	// Token and SPIFFEDir are the credentials the bootstraps present, as
	// the server accepts them (bootstrap.TLS); they need TLS (CA).
	Token     bool
	SPIFFEDir string
	// Namespaces, when not empty, are the only namespaces whose scopes get
	// a ConfigMap: the cache and RBAC then cover ConfigMaps of these alone.
	Namespaces []string

	// keyMu guards key, the install's published key (tlsOnlyKey).
	keyMu sync.Mutex
	key   []byte
	// deferred holds, per scope, when this replica first left its
	// ConfigMap to a newer count's replica (deferral).
	deferred sync.Map
}

// address is the xDS address key's bootstraps name: its slot's, with
// shards.
func (r *Reconciler) address(key model.Key) string {
	if r.Shards.Sharded() {
		return r.Shards.AddressOf(key)
	}
	return r.XDSServer
}

// writes reports whether this replica writes the ConfigMap of the scope
// named ns/name: one of its shard's, in a namespace that gets ConfigMaps.
func (r *Reconciler) writes(ns, name string) bool {
	return (len(r.Namespaces) == 0 || slices.Contains(r.Namespaces, ns)) && r.Shards.Owns(model.Key{Namespace: ns, Name: name})
}

// CABundle is the CA bundle of the xDS port's certificate, as
// xdstls.Certificates holds it.
type CABundle interface {
	// CABundle is the PEM bundle, empty until there is one.
	CABundle() []byte
	// Changed is closed when the bundle (or the certificate) changes.
	Changed() <-chan struct{}
}

// caWait is how soon a scope is tried again while the CA bundle is not
// there yet (the leader creates it at the start of its term).
const caWait = time.Second

// conflictRecheck is how often a scope whose ConfigMap name is taken is
// tried again: the ConfigMap in the way is not cached (it lacks the label),
// so its deletion raises no event.
const conflictRecheck = 10 * time.Second

// Conflicts holds, per scope, why its bootstrap ConfigMap cannot be
// written. It is safe for concurrent use.
type Conflicts struct {
	mu      sync.Mutex
	reasons map[model.Key]string
	changed *keyset.Set
}

// NewConflicts returns an empty record.
func NewConflicts() *Conflicts {
	return &Conflicts{reasons: map[model.Key]string{}, changed: keyset.New()}
}

// Changes holds the scopes whose conflict appeared or cleared.
func (c *Conflicts) Changes() *keyset.Set { return c.changed }

// Get returns why the scope's ConfigMap cannot be written, or "".
func (c *Conflicts) Get(key model.Key) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reasons[key]
}

func (c *Conflicts) set(key model.Key, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reasons[key] == reason {
		return
	}
	if reason == "" {
		delete(c.reasons, key)
	} else {
		c.reasons[key] = reason
	}
	c.changed.Add(key)
}

// Reconcile renders the scope's bootstraps into its ConfigMap.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := model.Key{Namespace: req.Namespace, Name: req.Name}
	if !r.writes(req.Namespace, req.Name) {
		return ctrl.Result{}, nil
	}
	ps := &xdsv1alpha1.ProxyScope{}
	if err := r.Client.Get(ctx, req.NamespacedName, ps); err != nil {
		if apierrors.IsNotFound(err) {
			r.Conflicts.set(key, "")
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var (
		tls *bootstrap.TLS
		ca  []byte
	)
	if r.CA != nil {
		if ca = r.CA.CABundle(); len(ca) == 0 {
			return ctrl.Result{RequeueAfter: caWait}, nil
		}
		tls = &bootstrap.TLS{CAFile: path.Join(cmp.Or(r.MountPath, bootstrap.MountPath), bootstrap.CAKey), Token: r.Token, SPIFFEDir: r.SPIFFEDir}
	}
	// Envoy's file-based SDS resources, each by its key; nil ones are
	// left out (bootstrap.EnvoySDS and the others say when).
	sds := map[string][]byte{}
	for key, render := range map[string]func(*bootstrap.TLS) ([]byte, error){
		bootstrap.SDSKey: bootstrap.EnvoySDS, bootstrap.CASDSKey: bootstrap.EnvoyCASDS, bootstrap.TokenSDSKey: bootstrap.EnvoyTokenSDS,
	} {
		out, err := render(tls)
		if err != nil {
			return ctrl.Result{}, reconcile.TerminalError(err)
		}
		if out != nil {
			sds[key] = out
		}
	}
	addr := r.address(key)
	envoy, err := bootstrap.Envoy(key, convert.Protocol(ps.Spec.Protocol), addr, tls)
	if err != nil {
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	grpc, err := bootstrap.GRPC(key, addr, tls)
	if err != nil {
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	var published []byte
	if tls != nil {
		if published, err = r.tlsOnlyKey(ctx); err != nil {
			return ctrl.Result{}, err
		}
	}
	grpcEnv := bootstrap.GRPCEnv(cmp.Or(r.MountPath, bootstrap.MountPath), tls)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ps.Namespace, Name: bootstrap.ConfigMapName(ps.Name)}}
	// The cache holds only ConfigMaps labelled as scopeplane's: one found
	// there but controlled by a live owner other than this scope belongs
	// to someone else and is never overwritten; one the create finds in
	// the way, unlabelled, is someone else's too.
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(cm), cm); err == nil && !metav1.IsControlledBy(cm, ps) {
		owner, err := r.liveOwner(ctx, cm)
		if err != nil {
			return ctrl.Result{}, err
		}
		if owner != "" {
			r.Conflicts.set(key, fmt.Sprintf("ConfigMap %s/%s is controlled by %s, not by this ProxyScope, so its bootstraps are not written: rename or delete that ConfigMap",
				cm.Namespace, cm.Name, owner))
			return ctrl.Result{RequeueAfter: conflictRecheck}, nil
		}
	} else if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	} else if err == nil {
		if wait := r.deferral(key, cm); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	// Written before under shards, or now, naming another address: the
	// scope's proxies must restart to follow.
	sharded := r.Shards.Sharded() || cm.Annotations[SlotsAnnotation] != ""
	moved := sharded && cm.Data[bootstrap.GRPCKey] != "" && !strings.Contains(cm.Data[bootstrap.GRPCKey], strconv.Quote(addr))
	_, err = controllerutil.CreateOrUpdate(ctx, r.Client, cm, func() error {
		if cm.Labels == nil {
			cm.Labels = map[string]string{}
		}
		cm.Labels[ManagedByLabel] = ManagedBy
		cm.Labels[xdsv1alpha1.ScopeLabel] = ps.Name
		cm.Data = map[string]string{bootstrap.EnvoyKey: string(envoy), bootstrap.GRPCKey: string(grpc), bootstrap.GRPCEnvKey: string(grpcEnv)}
		if tls != nil {
			cm.Data[bootstrap.CAKey] = string(ca)
			cm.Data[bootstrap.TLSOnlyKeyKey] = string(published)
		}
		for key, out := range sds {
			cm.Data[key] = string(out)
		}
		r.stampLayout(cm)
		// Adopted: the previous controller, a ProxyScope that no longer
		// exists (liveOwner), gives way.
		if c := metav1.GetControllerOf(cm); c != nil && c.UID != ps.UID {
			cm.OwnerReferences = slices.DeleteFunc(cm.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == c.UID })
		}
		return controllerutil.SetControllerReference(ps, cm, r.Client.Scheme())
	})
	if apierrors.IsAlreadyExists(err) {
		if behind, err := r.cacheBehind(ctx, cm); err != nil || behind {
			// Judged again (adopted, its owner named, or created) once
			// the cache shows what is there.
			return ctrl.Result{RequeueAfter: caWait}, err
		}
		r.Conflicts.set(key, fmt.Sprintf("ConfigMap %s/%s already exists without the label %s=%s, so it is not scopeplane's and its bootstraps are not written: rename or delete that ConfigMap",
			cm.Namespace, cm.Name, ManagedByLabel, ManagedBy))
		return ctrl.Result{RequeueAfter: conflictRecheck}, nil
	}
	if err == nil {
		r.Conflicts.set(key, "")
		if moved && r.Recorder != nil {
			r.Recorder.Eventf(ps, nil, corev1.EventTypeWarning, ShardMovedReason, "RewriteBootstrap",
				"this scope is now served by shard %d of %d at %s, which its bootstrap ConfigMap %s names now; proxies started before read the old address and follow only once restarted",
				r.Shards.Index, r.Shards.Count(), addr, cm.Name)
		}
	}
	return ctrl.Result{}, err
}

// ShardMovedReason is the reason of the Event on a scope whose bootstrap
// now names another xDS address.
const ShardMovedReason = "ShardMoved"

// The annotations that say under which number of slots a ConfigMap was
// last written (with the slots' address list, which a change of the count
// keeps, what decides its address; shards of one set of slots write
// alike), and when the first replica to write it under that number
// started; ConfigMaps only ever written unsharded carry neither.
const (
	SlotsAnnotation         = "scopeplane.dev/slots"
	WriterStartedAnnotation = "scopeplane.dev/writer-started"
)

// LayoutDefer bounds how long a replica leaves a scope's ConfigMap to a
// replica of another number of slots that started after it: longer than a
// rollout takes to stop the old layout's replicas, after which the
// deferring replica writes anyway. A layout that outlives it (a rollout
// stuck or aborted, a stamp left by a replica gone since, or written by
// hand) costs one rewrite per LayoutDefer, never a frozen bootstrap.
const LayoutDefer = 2 * time.Minute

// stampSkew is how far in this replica's future a stamp's start may be
// (the clocks of two nodes differ) before it is taken for no stamp.
const stampSkew = time.Minute

// deferral is how much longer this replica leaves cm, the ConfigMap of
// key, as it is: while cm was written under another number of slots by a
// replica that started after this one, for at most LayoutDefer from when
// this replica first found it so. During a change of the slots (a
// rollout) the newest layout's replicas are the later ones, and the old
// ones, about to stop, leave their bootstraps alone. A ConfigMap without a
// stamp was written unsharded.
func (r *Reconciler) deferral(key model.Key, cm *corev1.ConfigMap) time.Duration {
	now := r.now()
	started, err := time.Parse(time.RFC3339Nano, cm.Annotations[WriterStartedAnnotation])
	if cmp.Or(cm.Annotations[SlotsAnnotation], "1") == r.layout() || err != nil || !started.After(r.Started) || started.After(now.Add(stampSkew)) {
		r.deferred.Delete(key)
		return 0
	}
	first, _ := r.deferred.LoadOrStore(key, now)
	if left := LayoutDefer - now.Sub(first.(time.Time)); left > 0 {
		return left
	}
	r.deferred.Delete(key)
	return 0
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// layout is this replica's number of slots as SlotsAnnotation says it.
func (r *Reconciler) layout() string { return strconv.Itoa(r.Shards.Slots()) }

// stampLayout marks cm as written under this replica's number of slots:
// the number and, when it changes, this replica's start. A write under the
// same number keeps the stamp, so that leaders taking turns do not rewrite
// every ConfigMap, and an unsharded replica leaves a ConfigMap that never
// had a stamp without one.
func (r *Reconciler) stampLayout(cm *corev1.ConfigMap) {
	theirs := cm.Annotations[SlotsAnnotation]
	if cmp.Or(theirs, "1") == r.layout() && (theirs == "" || cm.Annotations[WriterStartedAnnotation] != "") {
		return
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[SlotsAnnotation] = r.layout()
	cm.Annotations[WriterStartedAnnotation] = r.Started.UTC().Format(time.RFC3339Nano)
}

// cacheBehind reports whether the ConfigMap a create found in the way of
// cm is one the cache does not show yet, as the API server has it: one
// carrying scopeplane's label (the cache holds those), or one gone since.
func (r *Reconciler) cacheBehind(ctx context.Context, cm *corev1.ConfigMap) (bool, error) {
	var reader client.Reader = r.Client
	if r.APIReader != nil {
		reader = r.APIReader
	}
	got := &corev1.ConfigMap{}
	if err := reader.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil {
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	return got.Labels[ManagedByLabel] == ManagedBy, nil
}

// tlsOnlyKey returns the install's published key (bootstrap.TLSOnlyKeyKey):
// the one its bootstrap ConfigMaps already carry, so that it outlives
// leaders and restarts without a store of its own (the oldest ConfigMap's
// when they differ, and the others then follow it), or a new one when
// none carries a valid key. The key is public and no credential; keeping
// it only spares every ConfigMap, and every client reading it, a change.
func (r *Reconciler) tlsOnlyKey(ctx context.Context) ([]byte, error) {
	r.keyMu.Lock()
	defer r.keyMu.Unlock()
	if r.key != nil {
		return r.key, nil
	}
	list := &corev1.ConfigMapList{}
	if err := r.Client.List(ctx, list, client.MatchingLabels{ManagedByLabel: ManagedBy}); err != nil {
		return nil, fmt.Errorf("listing the bootstrap ConfigMaps for the published key: %w", err)
	}
	var oldest *corev1.ConfigMap
	for i := range list.Items {
		cm := &list.Items[i]
		if _, scope := cm.Labels[xdsv1alpha1.ScopeLabel]; !scope || bootstrap.CheckTLSOnlyKey([]byte(cm.Data[bootstrap.TLSOnlyKeyKey])) != nil {
			continue
		}
		if oldest == nil || cm.CreationTimestamp.Before(&oldest.CreationTimestamp) ||
			cm.CreationTimestamp.Equal(&oldest.CreationTimestamp) && cm.Namespace+"/"+cm.Name < oldest.Namespace+"/"+oldest.Name {
			oldest = cm
		}
	}
	if oldest != nil {
		r.key = []byte(oldest.Data[bootstrap.TLSOnlyKeyKey])
		return r.key, nil
	}
	k, err := bootstrap.NewTLSOnlyKey()
	if err != nil {
		return nil, err
	}
	r.key = k
	return k, nil
}

// liveOwner names the controller of a ConfigMap that carries scopeplane's
// label, as "<Kind> <namespace>/<name> (uid <uid>)", when that controller
// still exists; "" when the ConfigMap is scopeplane's to adopt: it has no
// controller, or its controller is a ProxyScope that no longer exists
// under that UID. A ProxyScope deleted and re-created under the same name
// leaves such a ConfigMap behind until the garbage collector removes it
// (on an API server without one, for ever), and the new scope must not
// report its own old ConfigMap as a conflict. A controller of another
// kind is taken to exist: our ConfigMaps are only ever controlled by
// ProxyScopes, so anything else is someone else's.
func (r *Reconciler) liveOwner(ctx context.Context, cm *corev1.ConfigMap) (string, error) {
	c := metav1.GetControllerOf(cm)
	if c == nil {
		return "", nil
	}
	named := fmt.Sprintf("%s %s/%s (uid %s)", c.Kind, cm.Namespace, c.Name, c.UID)
	// An owner whose API version does not parse is someone else's too.
	if gv, err := schema.ParseGroupVersion(c.APIVersion); err != nil || gv.Group != xdsv1alpha1.GroupVersion.Group || c.Kind != "ProxyScope" {
		return named, nil
	}
	owner := &xdsv1alpha1.ProxyScope{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: cm.Namespace, Name: c.Name}, owner); {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", err
	case owner.UID != c.UID:
		return "", nil
	}
	return named, nil
}

// SetupWithManager watches ProxyScopes, the ConfigMaps they own and the
// CA bundle.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("bootstrap").
		For(&xdsv1alpha1.ProxyScope{}, builder.WithPredicates(predicate.GenerationChangedPredicate{},
			predicate.NewPredicateFuncs(func(o client.Object) bool { return r.writes(o.GetNamespace(), o.GetName()) }))).
		Owns(&corev1.ConfigMap{})
	if r.CA != nil {
		b = b.WatchesRawSource(source.Func(r.watchCA))
	}
	return b.Complete(r)
}

// watchCA queues every scope each time the CA bundle changes, until ctx
// ends.
func (r *Reconciler) watchCA(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	go func() {
		changed := r.CA.Changed()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
			// The next change is waited for from before the list, so
			// that none goes unseen.
			changed = r.CA.Changed()
			scopes := &xdsv1alpha1.ProxyScopeList{}
			if err := r.Client.List(ctx, scopes); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "listing the ProxyScopes to write the new CA bundle into their bootstrap ConfigMaps")
				continue
			}
			for _, ps := range scopes.Items {
				if !r.writes(ps.Namespace, ps.Name) {
					continue
				}
				q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&ps)})
			}
		}
	}()
	return nil
}
