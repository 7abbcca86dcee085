package feedback

import (
	"fmt"
	"testing"
	"time"

	"github.com/scopeplane/scopeplane/xds/model"
)

// The window reports complete buckets only, covers at most an hour, and
// forgets what is older.
func TestCostWindow(t *testing.T) {
	key := model.Key{Namespace: "shop", Name: "gw"}
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := start
	tr := New(0)
	tr.now = func() time.Time { return clock }
	at := func(d time.Duration) { clock = start.Add(d) }
	push := func(bytes, other int) {
		tr.Sent(key, model.SotW, "t", Push{Resources: 1, Bytes: bytes, OtherBytes: other})
	}

	at(10 * time.Second)
	tr.Sent(key, model.SotW, "t", Push{Resources: 3, Bytes: 300, OtherBytes: 290, Connect: true})
	push(100, 10)
	if w := tr.Get(key).Cost; w.Pushes != 0 || w.Span != 0 || !w.Pending {
		t.Errorf("the current bucket is reported before it is complete, or not said to be pending: %+v", w)
	}
	at(90 * time.Second)
	push(100, 10)
	tr.Sent(key, model.SotW, "t", Push{OtherBytes: 7}) // only the other protocol sends this one
	at(2*time.Minute + time.Second)
	w := tr.Get(key).Cost
	if w.Pending {
		t.Errorf("a bucket nothing was recorded in is pending: %+v", w)
	}
	want := Cost{Pushes: 3, Bytes: 500, OtherBytes: 317, Connects: 1, ConnectBytes: 300, ConnectOtherBytes: 290}
	if w.Cost != want || w.Span != 2*time.Minute || w.Bucket != time.Minute {
		t.Errorf("after two minutes: %+v, want %+v over 2m", w, want)
	}

	// After an hour the first minute has left the window.
	at(61*time.Minute + time.Second)
	w = tr.Get(key).Cost
	if w.Pushes != 1 || w.Bytes != 100 || w.OtherBytes != 17 || w.Span != time.Hour {
		t.Errorf("an hour later: %+v", w)
	}
	at(3 * time.Hour)
	if w = tr.Get(key).Cost; w.Pushes != 0 || w.Span != time.Hour {
		t.Errorf("hours later: %+v", w)
	}
}

// Usage follows subscriptions: a Service is used while a stream asks for
// it and for the window after the last one stopped; a wildcard asks for all.
func TestUsage(t *testing.T) {
	key := model.Key{Namespace: "shop", Name: "gw"}
	a, b := model.Key{Namespace: "shop", Name: "a"}, model.Key{Namespace: "shop", Name: "b"}
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := start
	tr := New(0)
	tr.now = func() time.Time { return clock }
	used := func() Usage { return tr.Get(key).Usage }

	one := tr.Connect(key, nil, model.SotW, "", "", model.Location{})
	two := tr.Connect(key, nil, model.SotW, "", "", model.Location{})
	tr.Asks(key, one, []model.Key{a, a, b}, nil, 0)
	tr.Asks(key, two, []model.Key{a}, nil, 0)
	if u := used(); u.All || !u.Services[a] || !u.Services[b] {
		t.Errorf("both asked for: %+v", u)
	}
	clock = clock.Add(time.Minute)
	tr.Asks(key, one, nil, []model.Key{a, a, b}, 0)
	tr.Disconnect(key, two)
	clock = clock.Add(59 * time.Minute)
	if u := used(); !u.Services[a] || !u.Services[b] {
		t.Errorf("within the hour after they stopped: %+v", u)
	}
	clock = clock.Add(time.Minute)
	if u := used(); len(u.Services) != 0 {
		t.Errorf("an hour after the last stream stopped: %+v", u)
	}
	tr.Asks(key, one, nil, nil, 1)
	if u := used(); !u.All {
		t.Errorf("a wildcard subscription does not ask for all: %+v", u)
	}
	tr.Disconnect(key, one)
	clock = clock.Add(time.Hour)
	if u := used(); u.All {
		t.Errorf("an hour after the wildcard stream left: %+v", u)
	}
}

// The numbers the usage gives Services follow those asked for now: after a
// stream asked for many Services in turn, each dropped again, the others'
// counts survive the renumbering and still leave with their stream.
func TestUsageRenumbers(t *testing.T) {
	key := model.Key{Namespace: "shop", Name: "gw"}
	kept := model.Key{Namespace: "shop", Name: "kept"}
	clock := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	tr := New(0)
	tr.now = func() time.Time { return clock }
	one := tr.Connect(key, nil, model.SotW, "", "", model.Location{})
	two := tr.Connect(key, nil, model.SotW, "", "", model.Location{})
	for i := range 3 * renumberSlack {
		if i == 5 {
			tr.Asks(key, two, []model.Key{kept, kept, kept}, nil, 0) // numbered 5, then 0
		}
		svc := model.Key{Namespace: "shop", Name: fmt.Sprint("s", i)}
		tr.Asks(key, one, []model.Key{svc}, nil, 0)
		tr.Asks(key, one, nil, []model.Key{svc}, 0)
	}
	if n := len(tr.scopes[key].usage.keys); n > 2+renumberSlack {
		t.Fatalf("%d Services numbered, 1 asked for", n)
	}
	tr.Asks(key, two, nil, []model.Key{kept, kept}, 0)
	if u := tr.scopes[key].usage; u.streams[u.index[kept]] != 1 {
		t.Fatalf("kept is asked for by %d streams, want 1", u.streams[u.index[kept]])
	}
	tr.Disconnect(key, two)
	clock = clock.Add(2 * time.Hour)
	if u := tr.Get(key).Usage; len(u.Services) != 0 {
		t.Errorf("two hours after every stream left: %+v", u)
	}
}
