package main

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryLimitEnv carries the container's memory limit, which the Helm chart
// sets from the downward API (resourceFieldRef limits.memory, in bytes).
const memoryLimitEnv = "SCOPEPLANE_MEMORY_LIMIT"

// memoryLimitShare is the part of the container's memory limit the Go heap
// is held to (GOMEMLIMIT). The rest is headroom for what the Go limit does
// not count exactly (goroutine stacks in flight, memory the runtime has not
// yet returned) so that the garbage collector works harder near the limit
// instead of the kernel killing the process at it.
const memoryLimitShare = 0.9

// goMemoryLimit decides the Go runtime's soft memory limit from the
// environment: none when GOMEMLIMIT is set (the runtime has applied it
// already, and the user's choice wins) or when the container's limit is
// unknown; otherwise memoryLimitShare of the container's limit. The reason
// says which, for the log.
func goMemoryLimit(getenv func(string) string) (limit int64, reason string, err error) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		return 0, "GOMEMLIMIT=" + v + " is set and overrides " + memoryLimitEnv, nil
	}
	raw := strings.TrimSpace(getenv(memoryLimitEnv))
	if raw == "" {
		return 0, memoryLimitEnv + " is not set: no Go memory limit", nil
	}
	q, err := resource.ParseQuantity(raw)
	if err != nil {
		return 0, "", fmt.Errorf("%s=%q is not a memory quantity (bytes, or a Kubernetes quantity such as 512Mi): %w", memoryLimitEnv, raw, err)
	}
	bytes, ok := q.AsInt64()
	if !ok || bytes <= 0 {
		return 0, "", fmt.Errorf("%s=%q must be a positive number of bytes", memoryLimitEnv, raw)
	}
	limit = int64(float64(bytes) * memoryLimitShare)
	return limit, fmt.Sprintf("%.0f%% of the container's memory limit (%s=%d)", memoryLimitShare*100, memoryLimitEnv, bytes), nil
}
