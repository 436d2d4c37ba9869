/* tq_cuda_mma_body.cuh — the body of attn_mma and attn_mma_many
 * (tq_cuda_attn.cu), included by both kernels: one text, so that the
 * single call's kernel compiles to the code measured before the batch
 * kernel existed (a shared __device__ function moved its shared variables
 * and registers; with this, sm_80 and sm_90 SASS are byte for byte the
 * same: ARCHITECTURE.md 5d).  The including kernel provides D, NWC, KO, SV
 * (template parameters), `a` (the pass's arguments) and MMA_H (its KV
 * head). */
	constexpr int R = TQC_TILE_ROWS; /* the mma's N */
	/* TQC_MMA_WARPS_MIN .. tqc_attn_mma_warps_max(D): attend_args_ok */
	const int NW = NWC ? NWC : a.mma_warps;
	constexpr bool ko = KO != 0; /* keys tq3o / tq4o (mma_ko chose this build) */
	static_assert(R == 8, "rows are the N of m16n8k16");
	TILED_SMEM(smem);
	__shared__ float s_m[NWC ? NWC : TQC_MMA_WARPS_MAX][R], s_l[NWC ? NWC : TQC_MMA_WARPS_MAX][R];
#if TQC_BULK
	/* each warp's stages' barriers */
	__shared__ tqc_mbar s_bar[NWC ? NWC : TQC_MMA_WARPS_MAX][TQC_MMA_STAGES];
#endif
	/* with cta_partials' s_f, s_rho and s_bad, s_last */
	static_assert(sizeof(s_m) + sizeof(s_l) + (TQC_BULK ? sizeof(uint64_t) * (NWC ? NWC : TQC_MMA_WARPS_MAX) * TQC_MMA_STAGES : 0) +
				      sizeof(float) * TQC_MMA_WARPS_MAX * R + 2 * sizeof(float) * R + 16 <=
			      (NWC ? TQC_MMA_STATIC_SMEM : TQC_MMA_STATIC_SMEM_ONE),
		      "static shared memory");

	const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
	const int g = lane >> 2, q = lane & 3;
	const int split = (int)blockIdx.y;
	const uint32_t h = MMA_H;
	const int r0 = (int)blockIdx.x * R;
	const int nrows = min(R, a.rows_ph - r0);
	const struct tq_page_geom geo = a.geom;
#ifdef TQC_PHASES
	struct tqc_phase_rec *const ph = ph_rec();
	if (ph && threadIdx.x == 0) {
		ph->gt_entry = ph_gtime();
		ph->c_entry = (uint64_t)clock64();
		ph->c_loop_first = ~(uint64_t)0; /* before the barriers: the warps' atomicMin */
		ph->smid = ph_smid();
		ph->grid[0] = gridDim.x, ph->grid[1] = gridDim.y, ph->grid[2] = gridDim.z;
		ph->warps = (uint32_t)NW;
		ph->written = 1u;
	}
#endif
	const uint32_t kb = geo.k_block_bytes, vb = geo.v_block_bytes, P = geo.page_tokens;
	const uint32_t stage_bytes = TQC_TILE * (kb + vb);
	const uint8_t *tab = smem;                                               /* the tables */
	uint8_t *qfs = smem + TQC_MMA_LUT_BYTES;                                 /* D = 256: Q^T */
	uint16_t *pw_all = reinterpret_cast<uint16_t *>(qfs + TQC_MMA_QF_BYTES(D));
	uint16_t *pw = pw_all + warp * R * TQC_TILE;                             /* this warp's [R][TILE] */
	uint8_t *stages = reinterpret_cast<uint8_t *>(pw_all + NW * R * TQC_TILE); /* all warps' */
	constexpr int NST = TQC_MMA_STAGES;
	static_assert(NST >= 2, "stages: one computed on, the rest in flight");
	uint8_t *stage0 = stages + (size_t)warp * NST * stage_bytes;                      /* this warp's */
	const int kbits = tiled_bits(a.kc), vbits = tiled_bits(a.vc);

	/* First of all, the loads the set-up would otherwise wait on, so that
	 * they fly during the tables' fill: each row's causal limit (lane r:
	 * row r's), this warp's rows' queries (rows w, w + NW: lane l holds
	 * coordinates l + 32 e) and the page of its first tile.  The split's
	 * tiles (n_fetch) ignore the rows' limits, not known yet: a tile past
	 * them (causal prefill only) is fetched and not used. */
	uint32_t my_lim = 0;
	if (lane < nrows)
		my_lim = a.causal ? (uint32_t)a.q_pos[(r0 + lane) / a.group] + 1u : a.kv_len;
	constexpr int QE = D / 32, QR = (R + TQC_MMA_WARPS_MIN - 1) / TQC_MMA_WARPS_MIN; /* rows a warp rotates, at most */
	float qv[QR][QE];
#pragma unroll
	for (int k = 0; k < QR; k++) {
		const int r = warp + k * NW;
#pragma unroll
		for (int e = 0; e < QE; e++)
			qv[k][e] = 0.0f;
		if (r < nrows) {
			const float *qp = a.q + q_row(a, h, r0 + r) * D;
#pragma unroll
			for (int e = 0; e < QE; e++)
				qv[k][e] = qp[lane + 32 * e];
		}
	}
	const uint64_t kh = tq_page_k_off(&geo, h, 0), vh = tq_page_v_off(&geo, h, 0);
	const uint32_t tb = (uint32_t)split * a.split_len;
	const uint32_t te0 = a.kv_len - tb < a.split_len ? a.kv_len : tb + a.split_len;
	const uint32_t n_fetch = te0 > tb ? (te0 - tb + TQC_TILE - 1) / TQC_TILE : 0;

	/* the next tile to fetch (f_i): its page (f_pi, its base loaded a tile
	 * ahead) and slot, advanced by NW tiles a step (no division per tile) */
	uint32_t f_i = (uint32_t)warp;
	uint32_t f_pi = (tb + f_i * TQC_TILE) / P, f_slot = (tb + f_i * TQC_TILE) % P;
	const uint8_t *f_pg = f_i < n_fetch ? a.pages[f_pi] : nullptr;
	auto advance = [&](uint32_t n) {
		f_i += NW;
		for (f_slot += NW * TQC_TILE; f_slot >= P; f_slot -= P)
			f_pi++;
		if (f_i < n)
			f_pg = a.pages[f_pi];
	};
#if TQC_BULK
	/* bulk copies: stage st's barrier, its phase's parity (bit st of
	 * phase) and whether a copy into it is in flight (bit st of busy) */
	tqc_mbar *bar = s_bar[warp];
	uint32_t phase = 0u, busy = 0u;
	if (lane == 0)
		for (int s = 0; s < NST; s++)
			mbar_init(&bar[s]);
	__syncwarp();
	auto fetch = [&](int st, uint32_t n) {
		if (f_i < n) {
			uint8_t *dst = stage0 + (size_t)st * stage_bytes;
			if (lane == 0) {
				mbar_expect(&bar[st], stage_bytes);
				bulk_copy(dst, f_pg + kh + (uint64_t)f_slot * kb, TQC_TILE * kb, &bar[st]);
				bulk_copy(dst + TQC_TILE * kb, f_pg + vh + (uint64_t)f_slot * vb, TQC_TILE * vb, &bar[st]);
			}
			__syncwarp(); /* armed before any lane waits on it */
			busy |= 1u << st;
		}
		advance(n);
	};
	auto landed = [&](int st) { /* stage st's copy (every lane) */
		mbar_wait(&bar[st], (phase >> st) & 1u);
		phase ^= 1u << st;
		busy &= ~(1u << st);
	};
#else
	/* one cp.async group per step, empty past the tiles (n); a tile's K
	 * blocks and V blocks are one run of 16-byte chunks in the stage */
	const uint32_t n_k16 = 2u * kb, n_16 = 2u * (kb + vb); /* chunks: TQC_TILE blocks = 2 x block bytes */
	auto fetch = [&](int st, uint32_t n) {
		if (f_i < n) {
			uint8_t *dst = stage0 + (size_t)st * stage_bytes;
			const uint8_t *ks = f_pg + kh + (uint64_t)f_slot * kb;
			const uint8_t *vs = f_pg + vh + (uint64_t)f_slot * vb - 16u * n_k16; /* + 16 j, j >= n_k16 */
			for (uint32_t j = (uint32_t)lane; j < n_16; j += 32)
				cp_async16(dst + 16u * j, (j < n_k16 ? ks : vs) + 16u * j);
		}
		cp_async_commit();
		advance(n);
	};
#endif

	/* the codebooks times their FP16 scales, for the tables: K's in
	 * s_cb[0..32) (tq3o / tq4o: the first half's), the second half's of
	 * tq3o / tq4o in s_cb[32..40), V's in s_cb[40..56) — in the weights'
	 * space, not used before the tiles (published by the barrier below) */
	float *s_cb = reinterpret_cast<float *>(pw_all);
	static_assert(TQC_MMA_WARPS_MIN * R * TQC_TILE * 2 >= 56 * sizeof(float), "codebooks in the weights' space");
	static_assert(TQC_CB_MAX == 32 && TQC_CB_B_MAX == 8, "codebook copies");
	if (threadIdx.x < 56) {
		const int i = (int)threadIdx.x;
		s_cb[i] = i < 32 ? a.kc.centroid[i] * a.kc.h16_scale
			  : i < 40 ? a.kc.centroid_b[i - 32] * a.kc.h16_scale_b
				   : a.vc.centroid[(i - 40) & 15] * a.vc.h16_scale;
	}
	if (warp != NW - 1)
		fetch(0, n_fetch);
	/* this warp's rows' qrot = scale2 R_k q (Hadamard or none), rotated in
	 * registers (strides below 32 by shuffles), into sq [R][SQS] — in the
	 * last warp's stages (it fits: attend_args_ok), so the other warps'
	 * first tiles can fly; the padded stride spreads the fragments' loads
	 * over the banks — with each row's scale rho = 2^k bringing its largest
	 * |q| into [256, 512) (1 for a zero row; a row with a non-finite q is
	 * NaN: s_bad).  Every warp runs QR slots whole (rows past R on zeros,
	 * not stored): no shuffle sits under a branch. */
	constexpr int SQS = D + 4;
	float *sq = reinterpret_cast<float *>(stages + (size_t)(NW - 1) * NST * stage_bytes);
	__shared__ float s_rho[R];
	__shared__ int s_bad[R];
	const bool had = a.kc.rot_kind == ROT_HADAMARD;
	const int qh_stop = ko ? QE / 2 : QE; /* tq3o / tq4o: each half its own transform */
#pragma unroll
	for (int k = 0; k < QR; k++) {
		const int r = warp + k * NW;
		float x[QE];
#pragma unroll
		for (int e = 0; e < QE; e++)
			x[e] = qv[k][e] * sign_of(a.kc, lane + 32 * e);
		reg_fwht<QE>(x, lane, qh_stop); /* unused without a rotation: no branch around it */
		float mx = 0.0f;
		bool bad = false;
#pragma unroll
		for (int e = 0; e < QE; e++) {
			x[e] = had ? (x[e] * a.kc.inv_sqrt_dim) * a.scale2 : qv[k][e] * a.scale2;
			bad |= !isfinite(x[e]);
			mx = fmaxf(mx, fabsf(x[e]));
		}
		mx = __uint_as_float(__reduce_max_sync(FULL, __float_as_uint(mx))); /* mx >= 0: ordered as bits */
		bad = __any_sync(FULL, bad);
		if (r < R) {
#pragma unroll
			for (int e = 0; e < QE; e++)
				sq[r * SQS + lane + 32 * e] = x[e];
			if (lane == 0) {
				s_rho[r] = bad || !(mx > 0.0f) ? 1.0f
							   : pow2i(iclamp(8 - ilog2f(fmaxf(mx, 0x1p-126f)), -126, 126));
				s_bad[r] = bad;
			}
		}
	}
	__syncthreads(); /* sq, s_rho, s_bad, s_cb */
	PH_AT(c_qrot);
	{ /* the tables: 16 bytes (4 of a row's 32 copies) a store: K's copies
	   * of a code's row, then V's; entry = (cb[lo nibble], cb[hi nibble])
	   * as FP16, the nibbles masked to the codec's index bits; tq3o / tq4o
	   * keys: (first half's cb[code's low 4 / 5 bits], second half's
	   * cb[the bits above]) (tqo_pair_codes) */
		const uint32_t ka = ko ? (uint32_t)a.kc.bits : 4u; /* the second entry's shift */
		const uint32_t mk = (1u << min(a.kc.bits, ko ? 5 : 4)) - 1u, mv = (1u << min(a.vc.bits, 4)) - 1u;
		const uint32_t mkb = ko ? (1u << a.kc.bits_b) - 1u : mk, okb = ko ? 32u : 0u;
		const bool k8 = tiled_bits(a.kc) == 8, v8 = tiled_bits(a.vc) == 8;
		u32x4 *t = reinterpret_cast<u32x4 *>(smem);
		constexpr int per_row = LUT_ROW / 16;
		for (int k = (int)threadIdx.x; k < 256 * per_row; k += NW * 32) {
			const uint32_t c = (uint32_t)(k / per_row);
			const bool vside = (k % per_row) >= per_row / 2;
			uint32_t v = 0u;
			if (vside && !v8)
				v = h2pack(s_cb[40u + (c & mv)], s_cb[40u + ((c >> 4) & mv)]);
			else if (!vside && !k8)
				v = h2pack(s_cb[c & mk], s_cb[okb + ((c >> ka) & mkb)]);
			t[k] = u32x4{ v, v, v, v };
		}
	}
	const float rho = s_rho[g];
	/* Q^T's fragments for lane (g, q): row g, pairs q D/8 + 2j (+ 1) */
	qfrags<D> qf;
#pragma unroll
	for (int j = 0; j < D / 16; j++) {
		const int pa = q * (D / 8) + 2 * j;
		const float *row = sq + g * SQS;
		const float v[4] = { row[pa] * rho, row[pa + D / 2] * rho, row[pa + 1] * rho, row[pa + 1 + D / 2] * rho };
		const uint32_t h0 = h2pack(v[0], v[1]), h1 = h2pack(v[2], v[3]);
		const uint32_t l0 = h2pack(v[0] - h2lo(h0), v[1] - h2hi(h0));
		const uint32_t l1 = h2pack(v[2] - h2lo(h1), v[3] - h2hi(h1));
		if constexpr (qfrags<D>::REG) {
			qf.r[j][0] = h0, qf.r[j][1] = h1, qf.r[j][2] = l0, qf.r[j][3] = l1;
		} else if (warp == 0) {
			reinterpret_cast<u32x4 *>(qfs)[j * 32 + lane] = u32x4{ h0, h1, l0, l1 };
		}
	}
	qf.s = reinterpret_cast<const u32x4 *>(qfs);
	/* this lane's rows 2q, 2q + 1: 1 / (K table scale * rho), NaN for a bad
	 * row (tq3o / tq4o: 1 / rho; mma_scores divides each half's table scale
	 * out, and applies the block scales) */
	const float ia = 1.0f / a.kc.h16_scale, ib = ko ? 1.0f / a.kc.h16_scale_b : 1.0f;
	float kinv[2];
	for (int k = 0; k < 2; k++)
		kinv[k] = s_bad[2 * q + k] ? QNAN : 1.0f / ((ko ? 1.0f : a.kc.h16_scale) * s_rho[2 * q + k]);
	/* keys [0, lim) visible to each row (rows past nrows: none) */
	const uint32_t lim[2] = { __shfl_sync(FULL, my_lim, 2 * q), __shfl_sync(FULL, my_lim, 2 * q + 1) };
	uint32_t tmax = my_lim; /* lanes 0 .. R - 1's largest, in every lane */
	for (int o = 1; o < R; o <<= 1)
		tmax = max(tmax, __shfl_xor_sync(FULL, tmax, o));
	tmax = __shfl_sync(FULL, tmax, 0);
	__syncthreads(); /* the tables, Q^T in shared memory; sq is free */
	PH_AT(c_tables);
	if (warp == NW - 1) {
#if TQC_BULK
		fence_proxy_async(); /* sq's stores before the copy over them */
#endif
		fetch(0, n_fetch);
	}
	const uint32_t te = te0 < tmax ? te0 : tmax;
	const uint32_t n_tile = te > tb ? (te - tb + TQC_TILE - 1) / TQC_TILE : 0;
#ifdef TQC_PHASES
	if (ph && threadIdx.x == 0)
		ph->tiles = n_tile;
#endif
	const uint32_t lim_e[2] = { lim[0] < te ? lim[0] : te, lim[1] < te ? lim[1] : te }; /* keys [0, lim_e) seen */

	/* the online softmax; acc holds sum p * vscale * 2^-E, l the lane's
	 * tokens' share of the row's sum */
	float m[2] = { NEG_INF, NEG_INF }, l[2] = { 0.0f, 0.0f }, acc[D / 16][4];
	int E = -126;
#pragma unroll
	for (int i = 0; i < D / 16; i++)
		acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

	/* sparse-V (thr = a.sparse_v > 0): a tile's values are neither decoded
	 * nor added while, for each of the 8 rows, the weight this warp skipped
	 * so far (sk: the row's, in every lane of its row pair's group;
	 * rescaled by alpha as l is) plus the tile's stays within
	 *     thr/2 x the warp's running sum + thr/(2 NW) x B,
	 * B a lower bound of the CTA's sum.  Both terms only grow, so at the
	 * end the NW warps skipped at most thr/2 of the sum of their sums plus
	 * NW x thr/(2 NW) of the CTA's: thr of the row's weight in this split,
	 * as tq_attn.c's rule (a warp's tile for its chunk; the split merge
	 * keeps the bound).  A warp's own sum alone would let it skip only
	 * what is small beside the tiles it walks (every NW-th), which rarely
	 * hold a sharp row's peaks.  B is a snapshot: at the iterations 0, 1,
	 * 3, 7, .. that every warp has, each warp publishes per row log2 of
	 * its weight (m + log2 l) in s_m or s_l in turn (free until the
	 * partials; a warp that reads one snapshot cannot be overtaken by a
	 * warp writing the next into the same array: the barrier between),
	 * and until the next snapshot each tile sums the last one's terms in
	 * the warp's scale (no register held across the tiles: the tq3o /
	 * tq4o builds have none to spare).  Taken at barriers, so the skips,
	 * and the bits, are the same every call.  B takes 0.999 of it, for the
	 * approximate log2 and 2^x, each term at most 2^64 of the warp's scale
	 * (a lower bound still, and finite); a NaN (a bad row) blocks every
	 * skip of its warps. */
	float sk[2] = { 0.0f, 0.0f };
	uint32_t n_skipped = 0; /* the tiles reached: the loop's count */

	uint32_t i = (uint32_t)warp;
	int st = 0;
	for (int s = 1; s < NST - 1; s++) /* stage 0's is in flight */
		fetch(s, n_tile);
	for (; i < n_tile; i += NW) {
		fetch(st == 0 ? NST - 1 : st - 1, n_tile); /* tile i + (NST - 1) NW */
#if TQC_BULK
		landed(st);
#else
		cp_async_wait<NST - 1>();
#endif
		__syncwarp();
#ifdef TQC_PHASES
		if (i == 0u)
			PH_AT(c_tile1); /* warp 0's first tile */
#endif

		const uint8_t *kt = stage0 + (size_t)st * stage_bytes, *vt = kt + TQC_TILE * kb;
		const uint32_t t0 = tb + i * TQC_TILE;
		/* scores of tokens g + 8u (sc[u]) for rows 2q, 2q + 1 */
		float sc[4][2];
		if constexpr (ko) {
			if (kbits == TB_TQ3O)
				mma_scores<D, TB_TQ3O>(kt, kb, tab, qf, lane, ia, ib, sc);
			else
				mma_scores<D, TB_TQ4O>(kt, kb, tab, qf, lane, ia, ib, sc);
		} else {
			switch (kbits) {
			case 2: mma_scores<D, 2>(kt, kb, tab, qf, lane, ia, ib, sc); break;
			case 3: mma_scores<D, 3>(kt, kb, tab, qf, lane, ia, ib, sc); break;
			case 4: mma_scores<D, 4>(kt, kb, tab, qf, lane, ia, ib, sc); break;
			default: mma_scores<D, 8>(kt, kb, tab, qf, lane, ia, ib, sc); break;
			}
		}
		/* a token's blocks past what a row sees (past the split, or the
		 * cache, or its causal limit) may be stale bytes: they count for
		 * nothing, not even the weights' scale */
		float vs[4], vmax = 0.0f;
		bool vis[4][2];
		uint32_t nonfin = 0;
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const uint32_t tt = (uint32_t)(g + 8 * u), t = t0 + tt;
			const float ks = ko ? 1.0f : __uint_as_float(*reinterpret_cast<const uint32_t *>(kt + tt * kb));
			vs[u] = __uint_as_float(*reinterpret_cast<const uint32_t *>(vt + tt * vb));
#pragma unroll
			for (int k = 0; k < 2; k++) {
				vis[u][k] = t < lim_e[k];
				sc[u][k] *= ks * kinv[k];
				nonfin |= vis[u][k] && !isfinite(sc[u][k]);
			}
			if (vis[u][0] || vis[u][1])
				vmax = fmaxf(vmax, fabsf(vs[u]));
		}
		/* the weights' scale: 2^-E with every p * |vscale| 2^-E < 2^15,
		 * over the tokens the lane's row pair sees (lanes q, q + 4, ...:
		 * E is the row pair's, as are the weights and sums it scales) */
		vmax = group_max(vmax);
		const int En = vmax > 0.0f && isfinite(vmax) ? iclamp(ilog2f(vmax) - 14, E, 113) : E;
		const float eshift = pow2i(E - En), vsc = pow2i(-En);
		E = En;
		float vsv[4];
#pragma unroll
		for (int u = 0; u < 4; u++)
			vsv[u] = vs[u] * vsc;
		/* a visible score that is not finite (a logit beyond float range)
		 * makes its row NaN: rare, so looked for per row only when some
		 * lane saw one */
		const bool any_bad = __any_sync(FULL, nonfin != 0u);
		float fac[2], alpha2[2], ps2[2];
#pragma unroll
		for (int k = 0; k < 2; k++) {
			bool ok[4];
			uint32_t badl = 0;
#pragma unroll
			for (int u = 0; u < 4; u++)
				ok[u] = vis[u][k];
			if (any_bad) {
				uint32_t b = 0;
#pragma unroll
				for (int u = 0; u < 4; u++) {
					b |= ok[u] && !isfinite(sc[u][k]);
					ok[u] = ok[u] && isfinite(sc[u][k]);
				}
				/* any lane of the row pair (lanes q, q + 4, ...) */
				badl = (__ballot_sync(FULL, b) >> q) & 0x11111111u;
			}
			float mx = NEG_INF;
#pragma unroll
			for (int u = 0; u < 4; u++)
				mx = fmaxf(mx, ok[u] ? sc[u][k] : NEG_INF);
			const float mn = fmaxf(m[k], group_max(mx));
			const float alpha = mn == NEG_INF ? 1.0f : ex2(m[k] - mn);
			float ps = 0.0f;
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const float p = ok[u] ? ex2(sc[u][k] - mn) : 0.0f;
				ps += p;
				pw[(2 * q + k) * TQC_TILE + g + 8 * u] = h1pack(ok[u] ? p * vsv[u] : 0.0f);
			}
			/* a visible score that is not finite makes the row NaN; l is
			 * this lane's share of the sum (alpha is the row's: the
			 * shares add up at the end) */
			l[k] = badl ? QNAN : l[k] * alpha + ps;
			m[k] = mn;
			fac[k] = alpha * eshift;
			alpha2[k] = alpha;
			ps2[k] = ps;
		}
		bool skip = false;
		if constexpr (SV) {
			const float thr_w = 0.5f * a.sparse_v, thr_b = 0.4995f * a.sparse_v / (float)NW;
			bool ok = true;
			float cm[2], lr[2];
#pragma unroll
			for (int k = 0; k < 2; k++) { /* the row's sums: its group's shares */
				cm[k] = group_sum(ps2[k]);
				lr[k] = group_sum(l[k]); /* every lane: no shuffle under a branch */
			}
			/* this warp's iteration, and the snapshot it reads: the last
			 * taken (n_all: the iterations every warp has) */
			const uint32_t it = (i - (uint32_t)warp) / (uint32_t)NW, n_all = n_tile / (uint32_t)NW;
			const uint32_t last = it < n_all ? it : n_all - 1u; /* n_all 0: no snapshot (b = 0) */
			/* snapshot k, taken at iteration 2^k - 1, in s_m (k even) or s_l */
			float (*pub)[R] = ((31 - __clz(last + 1u)) & 1) ? s_l : s_m;
			if ((it & (it + 1u)) == 0u && it < n_all) { /* 0, 1, 3, 7..: every warp has it */
#pragma unroll
				for (int k = 0; k < 2; k++)
					if (g == 0)
						pub[warp][2 * q + k] = lr[k] > 0.0f ? m[k] + lg2(lr[k])
									: lr[k] == 0.0f ? NEG_INF : QNAN;
				__syncthreads();
			}
#pragma unroll
			for (int k = 0; k < 2; k++) {
				float b = 0.0f;
				if (n_all) /* 2^-inf = 0; each term at most 2^64, finite; NaN stays */
					for (int j = 0; j < NW; j++) {
						const float x = pub[j][2 * q + k] - m[k];
						b += ex2(x > 64.0f ? 64.0f : x);
					}
				sk[k] *= alpha2[k];
				/* a row this warp saw nothing of (m -inf: no weight here) never
				 * holds a skip back; a NaN (bad row, or bound) always does */
				ok &= m[k] == NEG_INF || sk[k] + cm[k] <= thr_w * lr[k] + thr_b * b;
			}
			skip = __all_sync(FULL, ok);
			if (skip) {
				n_skipped++;
				sk[0] += cm[0];
				sk[1] += cm[1];
			}
		}
		if (__any_sync(FULL, fac[0] != 1.0f || fac[1] != 1.0f)) {
#pragma unroll
			for (int ii = 0; ii < D / 16; ii++) {
				acc[ii][0] *= fac[0];
				acc[ii][2] *= fac[0];
				acc[ii][1] *= fac[1];
				acc[ii][3] *= fac[1];
			}
		}
		if (!skip) {
			__syncwarp(); /* pw */
			switch (vbits) {
			case 2: mma_values<D, 2>(vt, vb, tab, pw, lane, acc); break;
			case 3: mma_values<D, 3>(vt, vb, tab, pw, lane, acc); break;
			case 4: mma_values<D, 4>(vt, vb, tab, pw, lane, acc); break;
			default: mma_values<D, 8>(vt, vb, tab, pw, lane, acc); break;
			}
		}
		__syncwarp(); /* the stage and pw are free again */
		st = st == NST - 1 ? 0 : st + 1;
	}
#if TQC_BULK
	/* copies still in flight (tiles fetched past the rows' limits) land
	 * before the stages take the partials */
	for (int s = 0; s < NST; s++)
		if (busy & (1u << s))
			landed(s);
	__syncwarp();
#else
	cp_async_wait<0>();
#endif
#ifdef TQC_PHASES
	if (ph && lane == 0) {
		const unsigned long long t = (unsigned long long)clock64();
		atomicMin(reinterpret_cast<unsigned long long *>(&ph->c_loop_first), t);
		atomicMax(reinterpret_cast<unsigned long long *>(&ph->c_loop_last), t);
	}
#endif

	if (SV && lane == 0 && n_tile > (uint32_t)warp) {
		atomicAdd(&a.sv_counts[0], (unsigned long long)((n_tile - (uint32_t)warp + NW - 1) / NW));
		atomicAdd(&a.sv_counts[1], (unsigned long long)n_skipped);
	}

	/* this warp's (m, l, acc): acc into its own first stage, [R][D], in the
	 * V frame (2^E / the V table's scale) */
	float *wacc = reinterpret_cast<float *>(stage0);
	l[0] = group_sum(l[0]);
	l[1] = group_sum(l[1]);
	/* (m, l) into s_m, s_l: here; with sparse-V, where its snapshots in
	 * them are read no more (below; one copy of the lines each, as a
	 * lambda taking m and l changed the exact builds' SASS on sm_90) */
	if constexpr (!SV) {
		if (g == 0) {
			s_m[warp][2 * q] = m[0], s_m[warp][2 * q + 1] = m[1];
			s_l[warp][2 * q] = l[0], s_l[warp][2 * q + 1] = l[1];
		}
		__syncwarp();
	}
	const float vfin = pow2i(E) / a.vc.h16_scale;
#pragma unroll
	for (int k = 0; k < 2; k++)
#pragma unroll
		for (int ii = 0; ii < D / 16; ii++) {
			const int p = g * (D / 16) + ii;
			wacc[(2 * q + k) * D + p] = acc[ii][k] * vfin;
			wacc[(2 * q + k) * D + p + D / 2] = acc[ii][k + 2] * vfin;
		}
	if constexpr (SV) {
		__syncthreads(); /* every warp is past its tiles */
		if (g == 0) {
			s_m[warp][2 * q] = m[0], s_m[warp][2 * q + 1] = m[1];
			s_l[warp][2 * q] = l[0], s_l[warp][2 * q + 1] = l[1];
		}
	}
	__syncthreads();
	cta_partials<R>(a, s_m, s_l, reinterpret_cast<const float *>(stages), (int)(NST * stage_bytes / 4u), D, r0,
			nrows, split, h, NW);

	/* the fused finish: the CTA that completes a (row block, KV head) last
	 * merges its splits (attn_finish's work, without its launch) and
	 * resets the count for the next launch */
	__shared__ bool s_last;
	__syncthreads(); /* every thread's partials are written */
	PH_AT(c_part);
	const uint32_t ci = h * (uint32_t)a.n_rb + blockIdx.x;
	if (threadIdx.x == 0) {
		/* release: the CTA's writes, ordered before this thread's fence by
		 * the barrier, before the count; acquire (the last CTA): the other
		 * CTAs' partials after it (the fence also drops this SM's L1
		 * lines).  One thread fences, not every thread. */
		__threadfence();
		const bool last = atomicAdd(&a.counters[ci], 1u) == (uint32_t)a.n_split - 1u;
		if (last)
			__threadfence();
		s_last = last;
	}
	__syncthreads();
	if (!s_last) {
		PH_EXIT();
		return;
	}
#ifdef TQC_PHASES
	if (ph && threadIdx.x == 0)
		ph->last = 1u;
#endif
	/* a warp per row, its scratch in the tables' space (free now) */
	static_assert(R * (TQC_SPLITS_MAX + TQ_DIM_MAX) * 4 <= TQC_MMA_LUT_BYTES, "finish scratch"); /* warps < R */
	float *s_w = reinterpret_cast<float *>(smem) + warp * (TQC_SPLITS_MAX + TQ_DIM_MAX);
	for (int r = warp; r < nrows; r += NW)
		finish_row<true>(a, q_row(a, h, r0 + r), s_w, s_w + TQC_SPLITS_MAX, nullptr);
	if (threadIdx.x == 0)
		a.counters[ci] = 0u;
	PH_EXIT();
