// RocketMQ's Node.js client (rocketmq-client-nodejs, unmodified) against `txlog rocketmq`:
// normal messages, a transactional message committed and one rolled back, a half message left
// undecided whose check-back a TransactionChecker answers, and a SimpleConsumer receiving and
// acknowledging. Prints one JSON line per event on stdout, for the test to compare with txlog.
//   node round_trip.js ENDPOINTS TOPIC GROUP
'use strict';

const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const [endpoints, topic, group] = process.argv.slice(2);
const quiet = { info() {}, warn() {}, error: (...a) => console.error(...a), debug() {} };
const emit = (event, fields) => console.log(JSON.stringify({ event, ...fields }));

async function main() {
  let checked;
  const checkedBack = new Promise(resolve => { checked = resolve; });
  const checker = {
    // The half message left undecided is committed when the gateway asks about it.
    async check(view) {
      emit('checked', { messageId: view.messageId, body: view.body.toString() });
      checked(view.messageId);
      return TransactionResolution.COMMIT;
    },
  };
  const producer = new Producer({ endpoints, namespace: '', topics: [ topic ], checker, logger: quiet, requestTimeout: 10000 });
  await producer.startup();

  for (const n of [ 1, 2 ]) {
    const receipt = await producer.send({ topic, tag: 'normal', keys: [ `k${n}` ], body: Buffer.from(`normal ${n}`) });
    emit('sent', { messageId: receipt.messageId, body: `normal ${n}` });
  }

  const committed = producer.beginTransaction();
  const c = await producer.send({ topic, tag: 'tx', body: Buffer.from('committed') }, committed);
  await committed.commit();
  emit('committed', { messageId: c.messageId, transactionId: c.transactionId });

  const rolledBack = producer.beginTransaction();
  const r = await producer.send({ topic, tag: 'tx', body: Buffer.from('rolled back') }, rolledBack);
  await rolledBack.rollback();
  emit('rolled back', { messageId: r.messageId, transactionId: r.transactionId });

  // Never ended by its producer: the gateway asks the checker once the message's immunity is over.
  const properties = new Map([ [ 'CHECK_IMMUNITY_TIME_IN_SECONDS', '1' ] ]);
  const o = await producer.send({ topic, tag: 'tx', body: Buffer.from('checked back'), properties }, producer.beginTransaction());
  emit('left undecided', { messageId: o.messageId, transactionId: o.transactionId });
  await checkedBack;

  const consumer = new SimpleConsumer({
    endpoints, namespace: '', consumerGroup: group, subscriptions: new Map([ [ topic, '*' ] ]),
    awaitDuration: 2000, logger: quiet, requestTimeout: 10000,
  });
  await consumer.startup();
  const wanted = new Set([ 'normal 1', 'normal 2', 'committed', 'checked back' ]);
  const deadline = Date.now() + 20000;
  while (wanted.size && Date.now() < deadline) {
    for (const view of await consumer.receive(16, 30000)) {
      await consumer.ack(view);
      wanted.delete(view.body.toString());
      emit('received', { messageId: view.messageId, body: view.body.toString(), tag: view.tag });
    }
  }
  await consumer.shutdown();
  await producer.shutdown();
  emit('done', { missing: [ ...wanted ] });
}

main().then(() => process.exit(0), err => {
  console.error(err && err.stack || err);
  process.exit(1);
});
