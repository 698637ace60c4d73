package shard

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recoverOptions are the first options of every gRPC server a node runs
// (client and peer listeners; the Raft and chain transports are served on
// the peer one): a handler that panics answers codes.Internal and logs one
// line with the method and stack, instead of taking the whole node, every
// replica on it, down. They come first so that they also catch a panic in
// the interceptors after them (auth, limits, fault injection).
//
// It covers the handler's own goroutine only: a goroutine a handler starts
// must not panic (the state machines refuse bad input with errors instead).
func recoverOptions(log hclog.Logger) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer recoverHandler(log, info.FullMethod, &err)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
			defer recoverHandler(log, info.FullMethod, &err)
			return h(srv, ss)
		}),
	}
}

// recoverHandler, deferred, turns a panic into the call's Internal error.
func recoverHandler(log hclog.Logger, method string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	// One line, stack included (newlines escaped), so that it greps whole.
	stack := strings.ReplaceAll(strings.TrimSpace(string(debug.Stack())), "\n", `\n`)
	log.Error("gRPC handler panicked; the call fails with Internal", "method", method, "panic", fmt.Sprint(r), "stack", stack)
	*err = status.Errorf(codes.Internal, "%s: internal error (handler panicked: %v)", method, r)
}
