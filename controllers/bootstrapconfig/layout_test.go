package bootstrapconfig

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// The stamps of the layouts, as two replicas of two numbers of slots write
// them in turn: the newer-started layout's stands, the older replica
// leaves it for at most LayoutDefer, an unsharded install never gets a
// stamp, shard counts of the same slots share theirs, and a stamp dated in
// the future is no stamp.
func TestLayoutStamps(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(time.Hour)
	clock := func() time.Time { return now }
	key := model.Key{Namespace: "shop", Name: "edge"}
	replica := func(count, slots int, started time.Time) *Reconciler {
		s := shard.Shards{}
		if count > 1 {
			s.N = count
			for i := range slots {
				s.Addresses = append(s.Addresses, "xds-"+string(rune('0'+i))+":18000")
			}
		}
		return &Reconciler{Shards: s, Started: started, Now: clock}
	}
	unsharded, oldTwo := replica(1, 1, t0.Add(30*time.Minute)), replica(2, 2, t0)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}}

	// An unsharded install writes no stamp, and defers to none.
	unsharded.stampLayout(cm)
	if len(cm.Annotations) != 0 || unsharded.deferral(key, cm) != 0 {
		t.Fatalf("unsharded: annotations %v", cm.Annotations)
	}
	// Sharding turned off: a replica of two shards wrote it, and the
	// unsharded replica, started later, writes over it and stamps "1".
	oldTwo.stampLayout(cm)
	if cm.Annotations[SlotsAnnotation] != "2" {
		t.Fatalf("two slots stamped %v", cm.Annotations)
	}
	if d := unsharded.deferral(key, cm); d != 0 {
		t.Fatalf("the later unsharded replica defers %v to an older count", d)
	}
	unsharded.stampLayout(cm)
	if cm.Annotations[SlotsAnnotation] != "1" || cm.Annotations[WriterStartedAnnotation] != unsharded.Started.Format(time.RFC3339Nano) {
		t.Fatalf("the unsharded replica over another count stamped %v", cm.Annotations)
	}
	// The older count's replica leaves it, for LayoutDefer at most.
	if d := oldTwo.deferral(key, cm); d != LayoutDefer {
		t.Fatalf("the older count defers %v, want %v", d, LayoutDefer)
	}
	now = now.Add(LayoutDefer / 2)
	if d := oldTwo.deferral(key, cm); d != LayoutDefer/2 {
		t.Fatalf("half way, the older count defers %v more, want %v", d, LayoutDefer/2)
	}
	now = now.Add(LayoutDefer / 2)
	if d := oldTwo.deferral(key, cm); d != 0 {
		t.Fatalf("after LayoutDefer, the older count still defers %v", d)
	}
	// Same count, another leader of it: no deferral, the stamp kept.
	same := replica(1, 1, t0.Add(50*time.Minute))
	before := cm.Annotations[WriterStartedAnnotation]
	if d := same.deferral(key, cm); d != 0 {
		t.Fatalf("a leader of the same count defers %v", d)
	}
	if same.stampLayout(cm); cm.Annotations[WriterStartedAnnotation] != before {
		t.Fatalf("a leader of the same count restamped %v", cm.Annotations)
	}
	// A stamp dated beyond the skew in the future (a clock gone wrong, or
	// a hand's edit) is no stamp.
	cm.Annotations[SlotsAnnotation] = "7"
	cm.Annotations[WriterStartedAnnotation] = now.Add(stampSkew + time.Second).Format(time.RFC3339Nano)
	if d := oldTwo.deferral(key, cm); d != 0 {
		t.Fatalf("a future stamp deferred %v", d)
	}

	// Two and then three shards of six slots: the later count writes the
	// same address and keeps the stamp, and the older count, finding the
	// later one's stamp, writes on as well, since it writes the same.
	two, three := replica(2, 6, t0), replica(3, 6, t0.Add(time.Minute))
	cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}}
	two.stampLayout(cm)
	stamp := cm.Annotations[WriterStartedAnnotation]
	if three.address(key) != two.address(key) {
		t.Fatalf("the scope's address changed with the shard count: %s, then %s", two.address(key), three.address(key))
	}
	if three.stampLayout(cm); cm.Annotations[SlotsAnnotation] != "6" || cm.Annotations[WriterStartedAnnotation] != stamp {
		t.Fatalf("three shards restamped what two of the same slots wrote: %v", cm.Annotations)
	}
	cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}}
	three.stampLayout(cm)
	if d := two.deferral(key, cm); d != 0 {
		t.Fatalf("two shards defer %v to three, started later, of the same slots", d)
	}
	// Unsharded, whatever addresses it is given, the layout is one slot.
	if got := (&Reconciler{Shards: shard.Shards{N: 1, Addresses: []string{"a:1", "b:1"}}}).layout(); got != "1" {
		t.Fatalf("one shard of two addresses has the layout %q, want 1", got)
	}
}
