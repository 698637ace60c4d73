package auth_test

import (
	"testing"

	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
)

// TestEveryClientMethodHasARole: every method of the client API has a
// role in the table (a new RPC fails this test until it is given one), and
// the table names no method the service lacks besides reflection's.
func TestEveryClientMethodHasARole(t *testing.T) {
	sd := shardpb.ParameterServer_ServiceDesc
	served := map[string]bool{}
	for _, m := range sd.Methods {
		served["/"+sd.ServiceName+"/"+m.MethodName] = true
	}
	for _, s := range sd.Streams {
		served["/"+sd.ServiceName+"/"+s.StreamName] = true
	}
	for m := range served {
		if r, ok := auth.MinRole(m); !ok || r == certs.RoleNone {
			t.Errorf("%s has no role in the authorization table (shard/auth/roles.go)", m)
		}
	}
	reflectionMethod := "/" + grpc_reflection_v1.ServerReflection_ServiceDesc.ServiceName + "/" + grpc_reflection_v1.ServerReflection_ServiceDesc.Streams[0].StreamName
	if r, ok := auth.MinRole(reflectionMethod); !ok || r != certs.RoleReader {
		t.Errorf("reflection (%s): %v, %v; want reader", reflectionMethod, r, ok)
	}
	for m := range auth.ClientRoles() {
		if !served[m] && m != reflectionMethod && m != "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo" {
			t.Errorf("the table names %s, which the client API does not serve", m)
		}
	}
	if _, ok := auth.MinRole("/raftps.v1.Peer/Reconfigure"); ok {
		t.Error("a peer API method has a client role")
	}
}
