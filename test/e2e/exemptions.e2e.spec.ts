import { BadRequestException, Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { GraphQLModule, Query, Resolver } from '@nestjs/graphql';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { RateLimit, RateLimitConfigurationError, RateLimitModule, RateLimiterService } from 'nest-rate-limit';
import {
  MemoryConfigCentre,
  RateLimitManagementService,
  RedisConfigCentre,
  rateLimitManagement,
} from 'nest-rate-limit/live';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { LogCapture } from '../support/log-capture.js';
import { describeStores, describeStoresAndPlatforms } from '../support/matrix.js';
import { until } from '../support/poll.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

type Req = { headers: Record<string, string | undefined> };
let keyLookups = 0;
const header = (context: ExecutionContext, name: string) => context.switchToHttp().getRequest<Req>().headers[name];

@Controller()
class ApiController {
  @Get('plain')
  @RateLimit({ count: 1, window: '1m' })
  plain() {
    return 'plain';
  }

  @Get('internal')
  @RateLimit({ count: 1, window: '1m', skipIf: (context) => header(context, 'x-internal') === 'yes' })
  internal() {
    return 'internal';
  }

  @Get('internal-async')
  @RateLimit({ count: 1, window: '1m', skipIf: async (context) => header(context, 'x-internal') === 'yes' })
  internalAsync() {
    return 'internal';
  }

  @Get('flaky-skip')
  @RateLimit({
    count: 1,
    window: '1m',
    skipIf: () => {
      throw new Error('flag service down');
    },
  })
  flakySkip() {
    return 'flaky';
  }

  @Get('partner')
  @RateLimit({
    count: 1,
    window: '1m',
    configKey: 'partner',
    by: (context) => header(context, 'x-api-key'),
    allow: { identities: ['partner-key'] },
  })
  partner() {
    return 'partner';
  }

  /** A key resolver that counts its calls, and throws without a key (as an API-key lookup does). */
  @Get('keyed')
  @RateLimit({
    count: 100,
    window: '1m',
    by: (context) => {
      keyLookups += 1;
      const key = header(context, 'x-api-key');
      if (!key) throw new BadRequestException('x-api-key is required');
      return key;
    },
  })
  keyed() {
    return 'keyed';
  }

  /** A lockout whose own allow list lets probes through from the nodes' network only. */
  @Get('login')
  @RateLimit({
    name: 'login',
    count: 2,
    window: '1m',
    allow: { userAgents: [{ agent: 'kube-probe', from: ['192.168.0.0/16'] }] },
  })
  login() {
    return 'login';
  }

  /** Two rules; only the per-address one lets the office through. */
  @Get('office')
  @RateLimit({ name: 'office.address', count: 1, window: '1m', allow: { addresses: ['10.0.0.0/8'] } })
  @RateLimit({ name: 'office.global', count: 5, window: '1m', by: 'global' })
  office() {
    return 'office';
  }
}

describeStoresAndPlatforms('skipIf and allow lists', (store, platform) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function start(rateLimit: object = {}, logger?: LogCapture): Promise<INestApplication> {
    app = await createTestApp({
      platform,
      trustProxy: true,
      logger,
      controllers: [ApiController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix(), ...rateLimit },
    });
    return app;
  }

  it('the module allow list: addresses (IPv4 and IPv6 networks) and user agents from their networks are not counted and get no headers', async () => {
    await start({
      allow: {
        addresses: ['203.0.113.0/24', '2001:db8::/32'],
        userAgents: [
          { agent: 'kube-probe', from: ['198.51.100.0/24'] },
          { agent: /^Pingdom/, from: ['192.0.2.1', '198.51.100.4'] },
        ],
      },
    });
    const clients: Record<string, string>[] = [
      { 'X-Forwarded-For': '203.0.113.9' },
      { 'X-Forwarded-For': '2001:db8:7::5' },
      { 'X-Forwarded-For': '198.51.100.4', 'User-Agent': 'kube-probe/1.31' },
      { 'X-Forwarded-For': '198.51.100.4', 'User-Agent': 'Pingdom.com_bot_version_1.4' },
    ];
    for (const client of clients) {
      const response = await request(app!.getHttpServer()).get('/plain').set(client);
      expect(response.status).toBe(200);
      expect(response.headers['ratelimit-limit']).toBeUndefined();
      expect(await statuses(app!, '/plain', 3, client)).toEqual([200, 200, 200]);
    }
    // None of them was counted: the address the probes came from still has its 1.
    expect(await statuses(app!, '/plain', 2, { 'X-Forwarded-For': '198.51.100.4' })).toEqual([200, 429]);
    expect(await statuses(app!, '/plain', 2, { 'X-Forwarded-For': '2001:db9::1' })).toEqual([200, 429]);
  });

  it('a user agent is what the client says it is: sent from outside its networks, it is limited like anyone, by every rule', async () => {
    await start({ allow: { userAgents: [{ agent: 'kube-probe', from: ['10.0.0.0/8'] }] } });
    const probe = { 'User-Agent': 'kube-probe/1.31' };
    // From the module list's network: no rule counts it.
    for (const path of ['/plain', '/login']) {
      expect(await statuses(app!, path, 4, { ...probe, 'X-Forwarded-For': '10.4.5.6' })).toEqual([200, 200, 200, 200]);
    }
    // From the login rule's own network: that rule does not count it; the module's list, of another network, does not exempt it.
    const nodeProbe = { ...probe, 'X-Forwarded-For': '192.168.1.2' };
    expect(await statuses(app!, '/login', 4, nodeProbe)).toEqual([200, 200, 200, 200]);
    expect(await statuses(app!, '/plain', 2, nodeProbe)).toEqual([200, 429]);
    // The same header from anywhere else: counted as any client is, the lockout included.
    const outsider = { ...probe, 'X-Forwarded-For': '198.51.100.9' };
    expect(await statuses(app!, '/plain', 3, outsider)).toEqual([200, 429, 429]);
    const first = await request(app!.getHttpServer()).get('/login').set(outsider);
    expect([first.status, first.headers['ratelimit-remaining']]).toEqual([200, '1']);
    expect(await statuses(app!, '/login', 30, outsider)).toEqual([200, ...Array.from({ length: 29 }, () => 429)]);
    // A client of that network without the header is counted too: the pair lets it through, not either alone.
    expect(await statuses(app!, '/plain', 2, { 'X-Forwarded-For': '10.4.5.7' })).toEqual([200, 429]);
  });

  it("the module's skipIf, and a rule's, sync or async: skipped requests are not counted", async () => {
    await start({ skipIf: (context: ExecutionContext) => header(context, 'x-synthetic') === '1' });
    expect(await statuses(app!, '/plain', 3, { 'x-synthetic': '1' })).toEqual([200, 200, 200]);
    expect(await statuses(app!, '/plain', 2)).toEqual([200, 429]);
    for (const path of ['/internal', '/internal-async']) {
      expect(await statuses(app!, path, 3, { 'x-internal': 'yes' })).toEqual([200, 200, 200]);
      expect(await statuses(app!, path, 2)).toEqual([200, 429]);
    }
  });

  it('a skipIf that throws skips nothing (fail closed), and says so by sampling', async () => {
    const logs = new LogCapture();
    await start({}, logs);
    expect(await statuses(app!, '/flaky-skip', 30)).toEqual([200, ...Array.from({ length: 29 }, () => 429)]);
    expect(logs.at('warn', /skipIf/)).toEqual([
      'skipIf of @RateLimit on ApiController.flakySkip failed (Error: flag service down); such requests are counted as if it said false: 1 since last report',
    ]);
    expect(logs.lines.filter((line) => line.level === 'error')).toEqual([]);
  });

  it("a rule's allowed identities are not counted; other rules of the route still count the request", async () => {
    await start();
    expect(await statuses(app!, '/partner', 3, { 'x-api-key': 'partner-key' })).toEqual([200, 200, 200]);
    expect(await statuses(app!, '/partner', 2, { 'x-api-key': 'someone' })).toEqual([200, 429]);

    const office = await request(app!.getHttpServer()).get('/office').set('X-Forwarded-For', '10.1.2.3');
    // Allowed by the per-address rule, counted by the global one: its headers only.
    expect(office.headers['ratelimit-limit']).toBe('5');
    expect(office.headers['ratelimit-remaining']).toBe('4');
    expect(await statuses(app!, '/office', 2, { 'X-Forwarded-For': '10.1.2.3' })).toEqual([200, 200]);
    // The global rule has 2 left; another address's own 1 is the tighter.
    expect(await statuses(app!, '/office', 3, { 'X-Forwarded-For': '192.0.2.1' })).toEqual([200, 429, 429]);
  });
});

describeStores('allow lists changed live through the config centre', (store) => {
  const apps: INestApplication[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  /** An instance with live limits: Redis's centre (shared by instances) or the in-process one. */
  async function instance(keyPrefix: string): Promise<INestApplication> {
    const redis = await store.redis();
    const app = await createTestApp({
      trustProxy: true,
      controllers: [ApiController],
      rateLimit: {
        redis,
        keyPrefix,
        configCentre: redis ? RedisConfigCentre : MemoryConfigCentre,
        extensions: [rateLimitManagement()],
        allow: { configKey: 'allow', addresses: ['203.0.113.0/24'] },
      },
    });
    apps.push(app);
    return app;
  }

  it('the module list: replaced, then emptied, on every instance', async () => {
    const keyPrefix = uniquePrefix();
    const first = await instance(keyPrefix);
    const others = store.name === 'Redis' ? [await instance(keyPrefix)] : [];
    const management = first.get(RateLimitManagementService);
    const office = { 'X-Forwarded-For': '198.51.100.7' };

    await management.set('allow', { allow: { addresses: ['198.51.100.0/24'] } }, { by: 'ops' });
    for (const app of [first, ...others]) {
      await until(async () => (await statuses(app, '/plain', 3, office)).every((status) => status === 200), {
        timeoutMs: 2_000,
        what: 'the allow list reaching the instance',
      });
    }
    // The list written replaced the one in code.
    expect(await statuses(first, '/plain', 2, { 'X-Forwarded-For': '203.0.113.1' })).toEqual([200, 429]);

    await management.set('allow', { allow: {} }, { by: 'ops' });
    for (const app of [first, ...others]) {
      await until(async () => (await statuses(app, '/plain', 1, office))[0] === 429, {
        timeoutMs: 2_000,
        what: 'the emptied allow list reaching the instance',
      });
    }
    expect((await management.changeLog(2)).map(({ by, configKey }) => ({ by, configKey }))).toEqual([
      { by: 'ops', configKey: 'allow' },
      { by: 'ops', configKey: 'allow' },
    ]);
  });

  it("a rule's list, by its configKey; values that are no allow list are refused, naming the field", async () => {
    const app = await instance(uniquePrefix());
    const management = app.get(RateLimitManagementService);
    await management.set('partner', { allow: { identities: ['acme'] } });
    expect(await statuses(app, '/partner', 3, { 'x-api-key': 'acme' })).toEqual([200, 200, 200]);
    // Replaced: the partner key of the decorator is counted now.
    expect(await statuses(app, '/partner', 2, { 'x-api-key': 'partner-key' })).toEqual([200, 429]);

    await expect(management.set('partner', { allow: { addresses: ['10.0.0.0/33'] } })).rejects.toThrow(
      "'allow.addresses[0]' must be an IPv4 or IPv6 address or network",
    );
    // A user agent alone is refused live as at bootstrap: any client can send it.
    await expect(management.set('allow', { allow: { userAgents: ['kube-probe'] } })).rejects.toThrow(
      "'allow.userAgents[0]' is a user agent alone, which any client can send",
    );
    await management.set('allow', { allow: { userAgents: [{ agent: 'kube-probe', from: ['10.0.0.0/8'] }] } });
    await expect(management.set('allow', { count: 5 })).rejects.toThrow(
      "config key 'allow' holds the module's allow list: 'count' is not a setting of it (only 'allow')",
    );
  });
});

describeStores('bans outrank every exemption', (store) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it('a banned client is refused though its address, user agent, identity or a skipIf would let it through', async () => {
    const redis = await store.redis();
    app = await createTestApp({
      trustProxy: true,
      controllers: [ApiController],
      rateLimit: {
        redis,
        keyPrefix: uniquePrefix(),
        configCentre: redis ? RedisConfigCentre : MemoryConfigCentre,
        extensions: [rateLimitManagement()],
        allow: { addresses: ['203.0.113.0/24'], userAgents: [{ agent: 'kube-probe', from: ['198.51.100.0/24'] }] },
        skipIf: (context: ExecutionContext) => header(context, 'x-synthetic') === '1',
      },
    });
    const management = app.get(RateLimitManagementService);
    const office = { 'X-Forwarded-For': '203.0.113.5' };
    const probe = { 'X-Forwarded-For': '198.51.100.9', 'User-Agent': 'kube-probe/1.31' };
    const synthetic = { 'X-Forwarded-For': '198.51.100.10', 'x-synthetic': '1' };
    // Each is let through, uncounted, before any ban.
    for (const client of [office, probe, synthetic])
      expect(await statuses(app, '/plain', 3, client)).toEqual([200, 200, 200]);
    expect(await statuses(app, '/partner', 3, { 'x-api-key': 'partner-key' })).toEqual([200, 200, 200]);

    for (const client of [office, probe, synthetic]) await management.ban('*', client['X-Forwarded-For'], '10m');
    await management.ban('ApiController.partner', 'partner-key', '10m');
    for (const client of [office, probe, synthetic]) {
      const refused = await request(app.getHttpServer()).get('/plain').set(client);
      expect(refused.status).toBe(403);
      expect(Number(refused.headers['retry-after'])).toBeGreaterThan(590);
    }
    expect(await statuses(app, '/partner', 1, { 'x-api-key': 'partner-key' })).toEqual([403]);
    const consumed = await app.get(RateLimiterService).consume('ApiController.partner', 'partner-key');
    expect({ allowed: consumed.allowed, banned: consumed.banned }).toEqual({ allowed: false, banned: true });
    // Others allowed as before.
    expect(await statuses(app, '/plain', 3, { 'X-Forwarded-For': '203.0.113.6' })).toEqual([200, 200, 200]);

    // While bans are held, a request's resolvers still run once.
    keyLookups = 0;
    expect(await statuses(app, '/keyed', 2, { 'x-api-key': 'k1' })).toEqual([200, 200]);
    expect(keyLookups).toBe(2);
    // A banned address is refused though no rule could name its identity and a skipIf lets it by.
    expect(await statuses(app, '/keyed', 1, { 'X-Forwarded-For': '198.51.100.9' })).toEqual([403]);
    expect(await statuses(app, '/keyed', 1, synthetic)).toEqual([403]);
    expect(await statuses(app, '/keyed', 1, { 'X-Forwarded-For': '198.51.100.11' })).toEqual([400]);
  });
});

@Resolver()
class AliasResolver {
  // Nullable: a refused alias is a null beside the others, not the end of the whole answer.
  @Query(() => String, { nullable: true })
  @RateLimit({
    count: 1000,
    window: '1m',
    skipIf: () => {
      throw new Error('flag service down');
    },
  })
  item() {
    return 'item';
  }
}

describe('a skipIf that throws on every alias of a GraphQL request', () => {
  it('writes one line, not one per alias', async () => {
    const logs = new LogCapture();
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true }),
        RateLimitModule.forRoot({ keyPrefix: uniquePrefix() }),
      ],
      providers: [AliasResolver],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: logs });
    await app.init();
    try {
      const aliases = Array.from({ length: 2_000 }, (_, i) => `a${i}: item`).join(' ');
      const response = await request(app.getHttpServer())
        .post('/graphql')
        .send({ query: `{ ${aliases} }` });
      // Fail closed: counted, 1,000 admitted and the rest refused.
      const data = response.body.data as Record<string, string | null>;
      expect(Object.values(data).filter((value) => value === 'item')).toHaveLength(1_000);
      expect(logs.at('warn', /skipIf/)).toHaveLength(1);
      expect(logs.lines.filter((line) => line.level === 'error')).toEqual([]);
    } finally {
      await app.close();
    }
  });
});

describe('allow lists checked at bootstrap', () => {
  it('names the field and the entry', () => {
    expect(() => RateLimitModule.forRoot({ allow: { addresses: ['10.0.0.300'] } })).toThrow(
      "RateLimitModule options: 'allow.addresses[0]' must be an IPv4 or IPv6 address or network ('10.0.0.0/8', '2001:db8::/32'), got \"10.0.0.300\"",
    );
    expect(() => RateLimitModule.forRoot({ skipIf: true as never })).toThrow(RateLimitConfigurationError);
  });

  it('names the route of a rule with a bad allow list', async () => {
    @Controller()
    class BadController {
      @Get()
      @RateLimit({ count: 1, window: '1m', allow: { userAgents: [{ agent: 42 as never, from: ['10.0.0.0/8'] }] } })
      get() {
        return 'x';
      }
    }
    await expect(createTestApp({ controllers: [BadController] })).rejects.toThrow(
      "@RateLimit on BadController.get: 'allow.userAgents[0].agent' must be a RegExp or a non-empty string, got 42",
    );
  });

  it('refuses a user agent alone, which any client can send, naming the field and the form that holds', async () => {
    expect(() => RateLimitModule.forRoot({ allow: { userAgents: ['kube-probe' as never] } })).toThrow(
      "RateLimitModule options: 'allow.userAgents[0]' is a user agent alone, which any client can send; give the networks it comes from: { agent: 'kube-probe', from: ['10.0.0.0/8'] }",
    );
    expect(() => RateLimitModule.forRoot({ allow: { userAgents: [/^Pingdom/ as never] } })).toThrow(
      "'allow.userAgents[0]' is a user agent alone, which any client can send; give the networks it comes from: { agent: /^Pingdom/, from: ['10.0.0.0/8'] }",
    );
    @Controller()
    class BareAgentController {
      @Get()
      @RateLimit({ count: 1, window: '1m', allow: { userAgents: ['kube-probe' as never] } })
      get() {
        return 'x';
      }
    }
    await expect(createTestApp({ controllers: [BareAgentController] })).rejects.toThrow(
      "@RateLimit on BareAgentController.get: 'allow.userAgents[0]' is a user agent alone, which any client can send",
    );
    // Networks that hold every address are the bare user agent again; none at all is none.
    for (const [from, problem] of [
      [['0.0.0.0/0'], "'allow.userAgents[0].from[0]' is every address"],
      [['10.0.0.0/8', '::/0'], "'allow.userAgents[0].from[1]' is every address"],
      [[], "'allow.userAgents[0].from' must be the networks the user agent comes from, at least one"],
      [undefined, "'allow.userAgents[0].from' must be the networks the user agent comes from, at least one"],
      [['10.0.0.300'], "'allow.userAgents[0].from[0]' must be an IPv4 or IPv6 address or network"],
    ] as const) {
      expect(() =>
        RateLimitModule.forRoot({ allow: { userAgents: [{ agent: 'kube-probe', from: from as never }] } }),
      ).toThrow(`RateLimitModule options: ${problem}`);
    }
  });
});
