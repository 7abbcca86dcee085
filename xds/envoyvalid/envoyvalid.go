// Package envoyvalid validates Envoy messages as Envoy does before it
// accepts them: each message's generated rules (protoc-gen-validate's
// ValidateAll) and those of every message packed in its Any fields (an
// HTTP filter's config, a route's per-filter config, a cluster's protocol
// options), which ValidateAll stops at. The bootstrap checker, the
// project's xDS client and the translator's tests share it.
package envoyvalid

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// Message runs m's ValidateAll and, for every Any reachable from m,
// unpacks it and validates its contents the same way: a packed type this
// binary does not know is an error, as Envoy refuses an extension it does
// not have.
func Message(m proto.Message) error {
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return err
		}
	}
	return walkAnys(m.ProtoReflect(), func(a *anypb.Any) error {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("typed config %s: %w", a.GetTypeUrl(), err)
		}
		if err := Message(inner); err != nil {
			return fmt.Errorf("typed config %s: %w", a.GetTypeUrl(), err)
		}
		return nil
	})
}

// walkAnys calls f on every Any set in m, without descending into them
// (f does).
func walkAnys(m protoreflect.Message, f func(*anypb.Any) error) error {
	if a, ok := m.Interface().(*anypb.Any); ok {
		return f(a)
	}
	var errs []error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				errs = append(errs, walkAnys(mv.Message(), f))
				return true
			})
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			for i := range v.List().Len() {
				errs = append(errs, walkAnys(v.List().Get(i).Message(), f))
			}
		case fd.Message() != nil:
			errs = append(errs, walkAnys(v.Message(), f))
		}
		return true
	})
	return errors.Join(errs...)
}
