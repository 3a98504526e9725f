package evals

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRead(t *testing.T) {
	tests := []struct {
		name, body string
		want       []Eval
	}{
		{"header and lines", "time_s,step,loss,accuracy\n0.000,0,2.30,0.10\n1.002,5,0.9,0.8\n", []Eval{{0, 0, 0.1}, {1.002, 5, 0.8}}},
		{"a line being written", "time_s,step,loss,accuracy\n0.5,3,1.0,0.5\n1.0,7,0.", []Eval{{0.5, 3, 0.5}}},
		{"junk", "x,y\n1,2,3,z\n", nil},
		{"empty", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "w.csv")
			if err := os.WriteFile(p, []byte(tt.body), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := Read(p)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
	if _, err := Read(filepath.Join(t.TempDir(), "missing.csv")); err == nil {
		t.Fatal("a missing file gave no error")
	}
}
