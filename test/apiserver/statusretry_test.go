package apiserver

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/metrics"
)

// blockLabel on a ProxyScope makes the test's admission policy refuse
// every write of its status.
const blockLabel = "test.scopeplane.dev/block-status"

// TestStatusPatchRefusedIsRetried has the API server refuse one scope's
// status patches (a ValidatingAdmissionPolicy) for a while: the failures
// are logged and counted, the other scope's status keeps following its
// proxies meanwhile, and once the API server accepts the patches again the
// scope's status is written.
func TestStatusPatchRefusedIsRetried(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	const ns = "refused"
	blocked, free := scope(ns, "blocked", "api", xdsv1alpha1.ProtocolSotW), scope(ns, "free", "api", xdsv1alpha1.ProtocolSotW)
	blocked.Labels = map[string]string{blockLabel: "true"}
	create(t, env,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api", Labels: map[string]string{"app": "api"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}}},
		&admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "block-status"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: ptr.To(admissionregistrationv1.Fail),
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
						Rule: admissionregistrationv1.Rule{
							APIGroups: []string{xdsv1alpha1.GroupVersion.Group}, APIVersions: []string{xdsv1alpha1.GroupVersion.Version},
							Resources: []string{"proxyscopes/status"},
						},
					},
				}}},
				Validations: []admissionregistrationv1.Validation{{
					Expression: fmt.Sprintf("!has(object.metadata.labels) || !(%q in object.metadata.labels)", blockLabel),
					Message:    "the test refuses this scope's status writes",
				}},
			},
		},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "block-status"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName: "block-status", ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		},
		blocked, free,
	)
	// The policy takes effect once the API server has loaded it: until the
	// test's own status write is refused.
	testkit.Eventually(t, "the admission policy refusing status writes", func() (bool, string) {
		ps, err := getScope(t, env, ns, "blocked")
		if err != nil {
			return false, err.Error()
		}
		ps.Status.Version = "probe"
		err = env.Client.Status().Update(context.Background(), ps)
		return err != nil, fmt.Sprint(err)
	})

	r := startReplica(t, env, "a", controlplane.Options{})
	key := ns + "/blocked"
	testkit.Eventually(t, "status patches of "+key+" failing, counted and logged, and retried", func() (bool, string) {
		n := testutil.ToFloat64(metrics.StatusWriteFailures.WithLabelValues(key))
		return n >= 3 && logged("patching the status of ProxyScope "+key, "the test refuses"), fmt.Sprintf("%v failures counted", n)
	})
	// Meanwhile the other scope's status follows its proxies.
	conn := []*proxy{connect(t, r.addr, adsclient.SotW, "free-1", ns+"/free"), connect(t, r.addr, adsclient.SotW, "free-2", ns+"/free")}
	awaitClusters(t, "the free scope's proxies configured", conn, 1)
	testkit.Eventually(t, ns+"/free status follows its proxies", func() (bool, string) {
		ps, err := getScope(t, env, ns, "free")
		if err != nil {
			return false, err.Error()
		}
		return ptr.Deref(ps.Status.ConnectedProxies, 0) == 2 && ps.Status.SyncedProxies == 2, fmt.Sprintf("%+v", ps.Status)
	})
	if ps, err := getScope(t, env, ns, "blocked"); err != nil || len(ps.Status.Conditions) != 0 {
		t.Fatalf("%s has status %+v (%v) while its writes are refused", key, ps.Status, err)
	}

	// The refusal ends. The label is metadata, which the status writer does
	// not watch: its retry writes the status.
	failures := testutil.ToFloat64(metrics.StatusWriteFailures.WithLabelValues(key))
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ps := &xdsv1alpha1.ProxyScope{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "blocked"}, ps); err != nil {
			return err
		}
		delete(ps.Labels, blockLabel)
		return env.Client.Update(context.Background(), ps)
	}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, key+" status written by a retry", func() (bool, string) {
		ps, err := getScope(t, env, ns, "blocked")
		if err != nil {
			return false, err.Error()
		}
		return meta.IsStatusConditionTrue(ps.Status.Conditions, xdsv1alpha1.ConditionAccepted) && ps.Status.Clusters == 1 && ps.Status.ObservedGeneration == ps.Generation,
			fmt.Sprintf("%+v", ps.Status)
	})
	t.Logf("%v failed patches of %s before the refusal ended, %v in all", failures, key, testutil.ToFloat64(metrics.StatusWriteFailures.WithLabelValues(key)))
}
