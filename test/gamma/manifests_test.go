package gamma_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// world is the API objects of a test: the suite's base manifests and the
// test's own.
type world struct {
	namespaces  []*corev1.Namespace
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	httpRoutes  []*gatewayv1.HTTPRoute
	grpcRoutes  []*gatewayv1.GRPCRoute
}

// documentSeparator splits a YAML stream into its documents.
var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// add reads a manifest file of several YAML documents into the world,
// strictly: a kind or a field the API types do not have is an error, so
// that a manifest is never read as less than it says.
func (w *world) add(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for i, doc := range documentSeparator.Split(string(data), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			obj = appendNew(&w.namespaces)
		case "apps/v1 Deployment":
			obj = appendNew(&w.deployments)
		case "v1 Service":
			obj = appendNew(&w.services)
		case "gateway.networking.k8s.io/v1 HTTPRoute":
			obj = appendNew(&w.httpRoutes)
		case "gateway.networking.k8s.io/v1 GRPCRoute":
			obj = appendNew(&w.grpcRoutes)
		default:
			return fmt.Errorf("%s: document %d: the kind %s %s is not read", path, i, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return fmt.Errorf("%s: document %d (%s): %w", path, i, tm.Kind, err)
		}
	}
	return nil
}

// appendNew appends a new object to a list and returns it, to be filled.
func appendNew[T any](list *[]*T) *T {
	o := new(T)
	*list = append(*list, o)
	return o
}

// pods returns the names of the Deployments whose Pods a Service selects:
// the prefixes of the names of the Pods that answer its requests, which is
// what the suite compares a case's Backend with.
func (w *world) pods(ns, name string) []string {
	var out []string
	for _, s := range w.services {
		if s.Namespace != ns || s.Name != name || len(s.Spec.Selector) == 0 {
			continue
		}
		sel := labels.SelectorFromSet(s.Spec.Selector)
		for _, d := range w.deployments {
			if d.Namespace == ns && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				out = append(out, d.Name)
			}
		}
	}
	return out
}
