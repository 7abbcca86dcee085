package xdstype

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// TestTable checks each entry against the protobuf registry and the ordering
// rules the server relies on.
func TestTable(t *testing.T) {
	seen := map[string]bool{}
	for typ := range Count {
		info := typ.Info()
		if seen[info.URL] || seen[info.Short] {
			t.Errorf("%v: URL or short name repeated", typ)
		}
		seen[info.URL], seen[info.Short] = true, true
		if got, ok := ByURL(info.URL); !ok || got != typ {
			t.Errorf("ByURL(%q) = %v, %v", info.URL, got, ok)
		}
		mt, err := protoregistry.GlobalTypes.FindMessageByURL(info.URL)
		if err != nil {
			t.Fatalf("%v: %v", typ, err)
		}
		// NameOf must read the message's name field, whichever it is.
		msg := mt.New()
		fields := msg.Descriptor().Fields()
		f := fields.ByName("name")
		if f == nil {
			f = fields.ByName("cluster_name")
		}
		msg.Set(f, protoreflect.ValueOfString("probe-"+info.Short))
		if got := info.NameOf(msg.Interface()); got != "probe-"+info.Short {
			t.Errorf("%v: NameOf = %q", typ, got)
		}
		if info.HasParent && info.Parent >= typ {
			t.Errorf("%v: its parent %v must precede it in ADS order", typ, info.Parent)
		}
		if info.VersionFollowsParent && !info.HasParent {
			t.Errorf("%v: version follows a parent it does not have", typ)
		}
	}
	if _, ok := ByURL("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"); ok {
		t.Error("ByURL accepts a type that is not served")
	}
	if len(URLs()) != int(Count) || len(All()) != int(Count) {
		t.Error("URLs or All miss a type")
	}
}
