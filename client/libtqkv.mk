# libtqkv: the client library (one public header, client/include/tqkv.h).
#
#   build/lib/libtqkv.a                 static
#   build/lib/libtqkv.so.$(VERSION)     shared, soname libtqkv.so.$(TQKV_SOMAJOR),
#                                       symbols versioned by client/libtqkv.map
#   build/lib/tqkv.pc                   pkg-config (from client/tqkv.pc.in)
#
# It carries the control client (ctl.c) and the generated protobuf-c code;
# only the tqkv_* symbols are exported from the shared library.
TQKV_SOMAJOR := 0
LIBTQKV_OBJS := $(OBJ)/client/tqkv.o $(OBJ)/client/ctl.o $(PROTO_OBJ)
LIBTQKV_LIBS := $(GRPC_LIBS) $(PBC_LIBS)
LIBTQKV_A    := $(LIB)/libtqkv.a
LIBTQKV_SO   := $(LIB)/libtqkv.so.$(VERSION)
TQKV_PC      := $(LIB)/tqkv.pc

$(OBJ)/client/tqkv.o: | $(PROTO_H)

$(LIBTQKV_A): $(LIBTQKV_OBJS) $(STAMP)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $(filter %.o,$^)

$(LIBTQKV_SO): $(LIBTQKV_OBJS) client/libtqkv.map $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -shared -Wl,-soname,libtqkv.so.$(TQKV_SOMAJOR) \
		-Wl,--version-script=client/libtqkv.map -o $@ $(filter %.o,$^) $(LIBTQKV_LIBS) $(LDLIBS_BASE)
	ln -sf libtqkv.so.$(VERSION) $(LIB)/libtqkv.so.$(TQKV_SOMAJOR)
	ln -sf libtqkv.so.$(TQKV_SOMAJOR) $(LIB)/libtqkv.so

# Regenerated whenever PREFIX, LIBDIR or INCDIR differ from the last build.
$(TQKV_PC): client/tqkv.pc.in VERSION FORCE
	@mkdir -p $(dir $@)
	@sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCDIR@|$(INCDIR)|g' \
		-e 's|@VERSION@|$(VERSION)|g' $< > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

ALL_TARGETS += $(LIBTQKV_A) $(LIBTQKV_SO) $(TQKV_PC)

# tqbench ring links libtqkv (static objects) and the kernels.
TQBENCH_OBJS += $(LIBTQKV_OBJS)
TQBENCH_LIBS += $(LIBTQKV_LIBS)

.PHONY: install-libtqkv
install: install-libtqkv
install-libtqkv: $(LIBTQKV_A) $(LIBTQKV_SO) $(TQKV_PC)
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR)
	install -m 0644 client/include/tqkv.h $(DESTDIR)$(INCDIR)/tqkv.h
	install -m 0644 $(LIBTQKV_A) $(DESTDIR)$(LIBDIR)/libtqkv.a
	install -m 0755 $(LIBTQKV_SO) $(DESTDIR)$(LIBDIR)/libtqkv.so.$(VERSION)
	ln -sf libtqkv.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libtqkv.so.$(TQKV_SOMAJOR)
	ln -sf libtqkv.so.$(TQKV_SOMAJOR) $(DESTDIR)$(LIBDIR)/libtqkv.so
	install -m 0644 $(TQKV_PC) $(DESTDIR)$(LIBDIR)/pkgconfig/tqkv.pc
