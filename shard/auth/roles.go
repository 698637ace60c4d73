package auth

import (
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/shardpb"
)

// Server reflection's methods: on the client listener, for any
// authenticated caller (a reader at least); never on the peer listener.
const (
	reflectionV1      = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	reflectionV1Alpha = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
)

// clientRoles is the least role each method of the client listener needs.
// A method that is not here is refused to everyone: a new RPC is closed
// until it is given a role (TestEveryClientMethodHasARole fails until then).
//
// reader: what reads state (rows, specs, the map, status, jobs, hot keys,
// and PeerContact, which the client's dead-node detection asks);
// writer: what changes rows or joins a training job;
// admin: what changes tables, nodes and the job registry for others, and
// bearer tokens (listing them too: their names and roles say who may do
// what).
var clientRoles = map[string]certs.Role{
	shardpb.ParameterServer_Pull_FullMethodName:          certs.RoleReader,
	shardpb.ParameterServer_PullBatch_FullMethodName:     certs.RoleReader,
	shardpb.ParameterServer_DescribeTable_FullMethodName: certs.RoleReader,
	shardpb.ParameterServer_ListTables_FullMethodName:    certs.RoleReader,
	shardpb.ParameterServer_Status_FullMethodName:        certs.RoleReader,
	shardpb.ParameterServer_GetJob_FullMethodName:        certs.RoleReader,
	shardpb.ParameterServer_GetClusterMap_FullMethodName: certs.RoleReader,
	shardpb.ParameterServer_HotKeys_FullMethodName:       certs.RoleReader,
	shardpb.ParameterServer_PeerContact_FullMethodName:   certs.RoleReader,
	shardpb.ParameterServer_Push_FullMethodName:          certs.RoleWriter,
	shardpb.ParameterServer_PushBatch_FullMethodName:     certs.RoleWriter,
	shardpb.ParameterServer_JoinJob_FullMethodName:       certs.RoleWriter,
	shardpb.ParameterServer_ReportEval_FullMethodName:    certs.RoleWriter,
	shardpb.ParameterServer_CreateTable_FullMethodName:   certs.RoleAdmin,
	shardpb.ParameterServer_AlterTable_FullMethodName:    certs.RoleAdmin,
	shardpb.ParameterServer_DropTable_FullMethodName:     certs.RoleAdmin,
	shardpb.ParameterServer_DeleteJob_FullMethodName:     certs.RoleAdmin,
	shardpb.ParameterServer_SetNodeAdmin_FullMethodName:  certs.RoleAdmin,
	shardpb.ParameterServer_CreateToken_FullMethodName:   certs.RoleAdmin,
	shardpb.ParameterServer_ListTokens_FullMethodName:    certs.RoleAdmin,
	shardpb.ParameterServer_DeleteToken_FullMethodName:   certs.RoleAdmin,
	reflectionV1:      certs.RoleReader,
	reflectionV1Alpha: certs.RoleReader,
}

// MinRole returns the least role a client needs to call the client API's
// method (a full method name, "/raftps.v1.ParameterServer/Push"); false if
// no role may call it.
func MinRole(method string) (certs.Role, bool) {
	r, ok := clientRoles[method]
	return r, ok
}

// ClientRoles returns a copy of the table of MinRole, for documentation.
func ClientRoles() map[string]certs.Role {
	out := make(map[string]certs.Role, len(clientRoles))
	for m, r := range clientRoles {
		out[m] = r
	}
	return out
}
