package main

import (
	"strings"
	"testing"
)

func TestGoMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		name      string
		env       map[string]string
		want      int64
		wantErr   string
		wantInWhy string
	}{
		{"the chart's 512Mi, in bytes from the downward API", map[string]string{memoryLimitEnv: "536870912"}, 483183820, "", "90% of the container's memory limit"},
		{"a quantity", map[string]string{memoryLimitEnv: "1Gi"}, 966367641, "", "1073741824"},
		{"GOMEMLIMIT overrides", map[string]string{memoryLimitEnv: "536870912", "GOMEMLIMIT": "300MiB"}, 0, "", "GOMEMLIMIT=300MiB is set"},
		{"no container limit", map[string]string{}, 0, "", "is not set"},
		{"not a quantity", map[string]string{memoryLimitEnv: "lots"}, 0, `SCOPEPLANE_MEMORY_LIMIT="lots" is not a memory quantity`, ""},
		{"zero", map[string]string{memoryLimitEnv: "0"}, 0, "must be a positive number of bytes", ""},
		{"negative", map[string]string{memoryLimitEnv: "-1Mi"}, 0, "must be a positive number of bytes", ""},
		{"too large for int64", map[string]string{memoryLimitEnv: "100Ei"}, 0, "must be a positive number of bytes", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, why, err := goMemoryLimit(func(k string) string { return c.env[k] })
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("limit %d, want %d", got, c.want)
			}
			if !strings.Contains(why, c.wantInWhy) {
				t.Errorf("reason %q does not say %q", why, c.wantInWhy)
			}
		})
	}
}
