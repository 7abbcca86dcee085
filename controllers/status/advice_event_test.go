package status

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/model"
)

// The advice is an Event when it becomes decisive or changes direction,
// and only then: not when its numbers move, nor while the saving wanders
// inside the hysteresis band, nor when the window grows quiet.
func TestAdviceEventOnlyOnDirectionChange(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Recorder: rec}
	ps := &xdsv1alpha1.ProxyScope{}
	in := served()
	// Each step is a window whose other protocol would have sent other
	// bytes per 1 MB sent, and the Event reason expected ("": none).
	steps := []struct {
		name  string
		span  time.Duration
		other int64
		event string
	}{
		{"a young window advises nothing", 3 * time.Minute, 0.5e6, ""},
		{"the first decisive advice", time.Hour, 0.95e6, "ProtocolAdviceKeep"},
		{"keep, with other numbers", time.Hour, 0.92e6, ""},
		{"keep, inside the band from below", time.Hour, 0.85e6, ""},
		{"a switch", time.Hour, 0.75e6, "ProtocolAdviceSwitch"},
		{"switch, with other numbers", time.Hour, 0.7e6, ""},
		{"switch, inside the band from above", time.Hour, 0.85e6, ""},
		{"switch, near the band's bottom", time.Hour, 0.89e6, ""},
		{"back to keep", time.Hour, 0.95e6, "ProtocolAdviceKeep"},
		{"keep, inside the band again", time.Hour, 0.88e6, ""},
		{"a quiet window", time.Hour, 0, ""},
	}
	for _, s := range steps {
		pushes := int64(600)
		if s.other == 0 {
			pushes = 3
		}
		in.Feedback.Cost = window(s.span, pushes, 1e6, s.other)
		before := ps.Status.Cost
		ps.Status.Cost, _ = cost(before, in)
		r.recordAdvice(ps, before)
		var got []string
		for len(rec.Events) > 0 {
			got = append(got, <-rec.Events)
		}
		switch {
		case s.event == "" && len(got) > 0:
			t.Errorf("%s (%s): Events %q, want none", s.name, ps.Status.Cost.Recommendation, got)
		case s.event != "" && (len(got) != 1 || !strings.HasPrefix(got[0], "Normal "+s.event+" "+ps.Status.Cost.Advice)):
			t.Errorf("%s (%s): Events %q, want one %s with the advice", s.name, ps.Status.Cost.Recommendation, got, s.event)
		}
	}
}

// A ProxylessGRPC scope in Delta is accepted, and a Warning Event says no
// gRPC client can join it; the same scope in SotW gets a Normal one.
func TestDeltaForGRPCIsAWarningEvent(t *testing.T) {
	for _, tc := range []struct {
		protocol model.Protocol
		want     string
	}{
		{model.Delta, "Warning " + xdsv1alpha1.ReasonDeltaForGRPC + " "},
		{model.SotW, "Normal " + xdsv1alpha1.ReasonResolved + " "},
	} {
		rec := events.NewFakeRecorder(10)
		r := &Reconciler{Recorder: rec}
		in := served()
		in.Mode, in.Protocol = model.ListenerProxylessGRPC, tc.protocol
		c := accepted(in)
		ps := &xdsv1alpha1.ProxyScope{}
		ps.Status.Conditions = []metav1.Condition{{Type: xdsv1alpha1.ConditionAccepted, Status: c.status, Reason: c.reason, Message: c.message}}
		r.recordTransitions(ps, nil)
		if len(rec.Events) != 1 {
			t.Fatalf("%s: %d Events, want 1", tc.protocol, len(rec.Events))
		}
		if got := <-rec.Events; !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: Event %q, want it to start with %q", tc.protocol, got, tc.want)
		}
	}
}
