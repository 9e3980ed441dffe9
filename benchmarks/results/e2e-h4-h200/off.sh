# MODEL= VARIANTS= DIR= GPU= TL= bash .ab/off.sh [bench e2e flags...]   (results in /tmp/$DIR on the machine, packed into $OUT/$DIR.tgz)
export CUDA_VISIBLE_DEVICES=${GPU:-0}
while nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i ${GPU:-0} | awk '{exit !($1>2000)}'; do sleep 3; done
log=$OUT/$DIR-$VARIANTS.log
echo "start $(date +%T) gpu ${GPU:-0}" > $log
timeout ${TL:-450} samoyeds-vllm bench e2e --model ${MODEL:-qwen3-30b-a3b} --out /tmp/$DIR --variants $VARIANTS "$@" >> $log 2>&1
echo "$DIR $VARIANTS rc=$? end $(date +%T)" | tee -a $log
(cd /tmp && tar czf $OUT/$DIR.tgz --exclude='*.safetensors' $DIR)
