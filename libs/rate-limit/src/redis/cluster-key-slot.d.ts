// The package ships no types. It is the slot function ioredis itself routes Cluster commands with.
declare module 'cluster-key-slot' {
  /** The Redis Cluster hash slot (0-16383) of a key, honouring `{hash tags}`. */
  export default function calculateSlot(key: string | Buffer): number;
}
