package main

import (
	"bytes"
	"testing"

	"github.com/raftps/raftps/shard/client"
)

func TestPrintHot(t *testing.T) {
	var out bytes.Buffer
	printHot(&out, []client.HotKeyRow{
		{Table: "ads", Shard: 1, Key: 9, Rate: 1000, ReadReplicas: []string{}},
		{Table: "users", Shard: 0, Key: 7, Rate: 3200.25, ReadReplicas: []string{"n2", "n3"}},
		{Table: "users", Shard: 1, Key: 11, Rate: 2000, ReadReplicas: []string{"n1"}},
	})
	want := `TABLE  SHARD  KEY  RATE(pulls/s)  READ-REPLICAS
ads    1      9    1000.0         (none)
users  0      7    3200.2         n2,n3
users  1      11   2000.0         n1
`
	if out.String() != want {
		t.Errorf("status --hot:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	printHot(&out, nil)
	if out.String() != "no hot keys\n" {
		t.Errorf("status --hot with none: %q", out.String())
	}
}
