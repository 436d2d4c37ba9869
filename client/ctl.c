#include "ctl.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "tqkv.pb-c.h"
#include "tq_size.h"

struct ctl {
	grpc_channel *chan;
};

__attribute__((format(printf, 4, 5)))
static int fail(struct ctl_status *st, int code, int r, const char *fmt, ...)
{
	va_list ap;

	if (st) {
		st->code = code;
		va_start(ap, fmt);
		vsnprintf(st->msg, sizeof(st->msg), fmt, ap);
		va_end(ap);
	}
	return r;
}

int ctl_open(struct ctl **out, const char *target, struct ctl_status *st)
{
	struct ctl *c;

	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return fail(st, GRPC_STATUS_RESOURCE_EXHAUSTED, -ENOMEM, "%s", "out of memory");
	grpc_init();
	grpc_arg args[] = {
		/* replies list every session: allow large ones */
		{ .type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
		  .value.integer = 256 << 20 },
		/* a local daemon: do not wait long for a connection */
		{ .type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
		  .value.integer = 100 },
	};
	grpc_channel_args ca = { sizeof(args) / sizeof(args[0]), args };
	grpc_channel_credentials *creds = grpc_insecure_credentials_create();
	c->chan = grpc_channel_create(target, creds, &ca);
	grpc_channel_credentials_release(creds);
	if (!c->chan) {
		free(c);
		grpc_shutdown();
		return fail(st, GRPC_STATUS_INVALID_ARGUMENT, -EINVAL, "bad target '%s'", target);
	}
	*out = c;
	return 0;
}

void ctl_close(struct ctl *c)
{
	if (!c)
		return;
	grpc_channel_destroy(c->chan);
	free(c);
	grpc_shutdown_blocking();
}

int ctl_call_raw(struct ctl *c, const char *path, const void *req, size_t len,
		 void **reply, size_t *reply_len, int timeout_ms, struct ctl_status *st)
{
	grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
	grpc_slice method = grpc_slice_from_copied_string(path);
	grpc_slice body = grpc_slice_from_copied_buffer(req, len);
	grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&body, 1);
	grpc_byte_buffer *recv = NULL;
	grpc_metadata_array md_init, md_trail;
	grpc_status_code code = GRPC_STATUS_UNKNOWN;
	grpc_slice details = grpc_empty_slice();
	gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
					     gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
	grpc_call *call;
	grpc_op ops[6];
	int r = 0;

	*reply = NULL;
	*reply_len = 0;
	grpc_metadata_array_init(&md_init);
	grpc_metadata_array_init(&md_trail);
	call = grpc_channel_create_call(c->chan, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL, deadline, NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = send;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_init;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &recv;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &md_trail;
	ops[5].data.recv_status_on_client.status = &code;
	ops[5].data.recv_status_on_client.status_details = &details;
	if (!call || grpc_call_start_batch(call, ops, 6, ops, NULL) != GRPC_CALL_OK) {
		r = fail(st, GRPC_STATUS_INTERNAL, -EIO, "%s", "cannot start the call");
		goto out;
	}
	grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
		r = fail(st, GRPC_STATUS_INTERNAL, -EIO, "%s", "call failed");
		goto out;
	}
	if (st) {
		st->code = (int)code;
		size_t n = GRPC_SLICE_LENGTH(details);
		if (n >= sizeof(st->msg))
			n = sizeof(st->msg) - 1;
		memcpy(st->msg, GRPC_SLICE_START_PTR(details), n);
		st->msg[n] = '\0';
	}
	if (code != GRPC_STATUS_OK) {
		r = (int)code;
		goto out;
	}
	if (!recv) {
		r = fail(st, GRPC_STATUS_INTERNAL, -EPROTO, "%s", "the daemon sent no reply message");
		goto out;
	}
	grpc_byte_buffer_reader rd;
	if (!grpc_byte_buffer_reader_init(&rd, recv)) {
		r = fail(st, GRPC_STATUS_INTERNAL, -EPROTO, "%s", "unreadable reply");
		goto out;
	}
	grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
	grpc_byte_buffer_reader_destroy(&rd);
	*reply_len = GRPC_SLICE_LENGTH(all);
	*reply = malloc(*reply_len ? *reply_len : 1);
	if (!*reply) {
		grpc_slice_unref(all);
		r = fail(st, GRPC_STATUS_RESOURCE_EXHAUSTED, -ENOMEM, "%s", "out of memory");
		goto out;
	}
	memcpy(*reply, GRPC_SLICE_START_PTR(all), *reply_len);
	grpc_slice_unref(all);
out:
	if (call)
		grpc_call_unref(call);
	grpc_completion_queue_shutdown(cq);
	while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN)
		;
	grpc_completion_queue_destroy(cq);
	if (recv)
		grpc_byte_buffer_destroy(recv);
	grpc_byte_buffer_destroy(send);
	grpc_slice_unref(body);
	grpc_slice_unref(method);
	grpc_slice_unref(details);
	grpc_metadata_array_destroy(&md_init);
	grpc_metadata_array_destroy(&md_trail);
	return r;
}

int ctl_call(struct ctl *c, const char *name, const ProtobufCMessage *req,
	     ProtobufCMessage **reply, int timeout_ms, struct ctl_status *st)
{
	const ProtobufCServiceDescriptor *sd = &tqkv__v1__control__descriptor;
	const ProtobufCMethodDescriptor *md = protobuf_c_service_descriptor_get_method_by_name(sd, name);
	char path[128];
	uint8_t *buf = NULL;
	void *rep = NULL;
	size_t len, rep_len;
	int r;

	*reply = NULL;
	if (!md)
		return fail(st, GRPC_STATUS_UNIMPLEMENTED, -EINVAL, "no method %s", name);
	if (req->descriptor != md->input)
		return fail(st, GRPC_STATUS_INVALID_ARGUMENT, -EINVAL, "%s: wrong request type", name);
	snprintf(path, sizeof(path), "/%s/%s", sd->name, md->name);
	len = protobuf_c_message_get_packed_size(req);
	buf = malloc(len ? len : 1);
	if (!buf)
		return fail(st, GRPC_STATUS_RESOURCE_EXHAUSTED, -ENOMEM, "%s", "out of memory");
	protobuf_c_message_pack(req, buf);
	r = ctl_call_raw(c, path, buf, len, &rep, &rep_len, timeout_ms, st);
	free(buf);
	if (r != 0)
		return r;
	*reply = protobuf_c_message_unpack(md->output, NULL, rep_len, rep);
	free(rep);
	if (!*reply)
		return fail(st, GRPC_STATUS_INTERNAL, -EPROTO, "%s: malformed reply", name);
	return 0;
}

const char *ctl_status_name(int code)
{
	static const char *const names[] = {
		"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
		"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
		"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
		"UNAUTHENTICATED",
	};
	if (code < 0 || code >= (int)(sizeof(names) / sizeof(names[0])))
		return "?";
	return names[code];
}

int ctl_parse_size(const char *s, uint64_t *out)
{
	return tq_size_parse(s, out);
}

void ctl_format_size(uint64_t v, char *buf, size_t n)
{
	tq_size_format_human(v, buf, n);
}
