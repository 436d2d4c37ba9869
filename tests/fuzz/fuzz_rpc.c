/* fuzz_rpc — the control plane's requests (daemon/rpc.c): the bytes of a
 * gRPC message body, as every handler receives them.  The first byte picks
 * the method of tqkv.v1.Control (modulo their count); the rest goes the
 * way call_handle sends it: rpc_wire_check (no NUL inside a string field),
 * protobuf-c's unpack with the method's input descriptor, then
 * rpc_request_check (ids, tenant and session names, codecs, kv_transform,
 * the geometry through session_geom_check, budget changes).  Proves, for
 * any bytes and every request type: no crash, leak or out-of-bounds read
 * in any of the three; a refusal always says why; what the checks accept
 * has printable names of the allowed characters, an id > 0 where one is
 * needed, and (OpenSession) a geometry session_geom_check accepts; and a
 * message packed again gets the same verdict. */
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "config.h"
#include "fuzz.h"
#include "rpc.h"
#include "tqkv.pb-c.h"

static void name_ok(const char *s)
{
	if (!s[0] || config_check_name(s) < 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const ProtobufCServiceDescriptor *sd = &tqkv__v1__control__descriptor;
	const ProtobufCMessageDescriptor *d;
	ProtobufCMessage *req, *again;
	const char *field = NULL;
	char why[512] = "", why2[512];
	unsigned m;
	int code;

	if (size < 1)
		return 0;
	m = data[0] % sd->n_methods;
	d = sd->methods[m].input;
	if (rpc_wire_check(d, data + 1, size - 1, 0, &field) < 0) {
		if (!field || !field[0])
			abort(); /* the refusal names the field */
		return 0;
	}
	if (!(req = protobuf_c_message_unpack(d, NULL, size - 1, data + 1)))
		return 0;
	code = rpc_request_check(m, req, why, sizeof(why));
	if (code != 0 && !why[0])
		abort();
	if (code == 0) {
		if (d == &tqkv__v1__open_session_request__descriptor) {
			const Tqkv__V1__OpenSessionRequest *q = (const void *)req;
			if (q->tenant[0])
				name_ok(q->tenant);
			if (q->name[0])
				name_ok(q->name);
			if (q->detached && !q->data_client)
				abort();
			if (q->n_layers == 0 || q->n_kv_heads == 0 || q->head_dim == 0 || q->max_tokens == 0)
				abort();
		} else if (d == &tqkv__v1__session_ref__descriptor) {
			if (((const Tqkv__V1__SessionRef *)(const void *)req)->id == 0)
				abort();
		} else if (d == &tqkv__v1__spill_session_request__descriptor) {
			if (((const Tqkv__V1__SpillSessionRequest *)(const void *)req)->id == 0)
				abort();
		} else if (d == &tqkv__v1__list_sessions_request__descriptor) {
			const Tqkv__V1__ListSessionsRequest *q = (const void *)req;
			if (q->tenant[0])
				name_ok(q->tenant);
		} else if (d == &tqkv__v1__set_tenant_budget_request__descriptor) {
			const Tqkv__V1__SetTenantBudgetRequest *q = (const void *)req;
			name_ok(q->tenant);
			if (!q->set_limit && !q->set_guaranteed)
				abort();
		}
	}
	/* packed again (unknown fields dropped): the same verdict */
	size_t len = protobuf_c_message_get_packed_size(req);
	uint8_t *buf = malloc(len ? len : 1);
	if (buf) {
		protobuf_c_message_pack(req, buf);
		if (rpc_wire_check(d, buf, len, 0, &field) < 0)
			abort(); /* the unpacked strings are C strings: no NUL */
		/* protobuf-c keeps unknown fields verbatim, field number 0 among
		 * them, and then refuses its own output: only what unpacks again
		 * is compared (seeds/rpc/repack_field0) */
		if ((again = protobuf_c_message_unpack(d, NULL, len, buf))) {
			if ((rpc_request_check(m, again, why2, sizeof(why2)) != 0) != (code != 0))
				abort();
			protobuf_c_message_free_unpacked(again, NULL);
		}
		free(buf);
	}
	protobuf_c_message_free_unpacked(req, NULL);
	return 0;
}
