# Task generation: the training tasks with their corpus, and the held-out test tasks with theirs.
# runs/<RUN>/tasks.parquet, corpus.parquet            (train split; the corpus only with multihop)
# runs/<RUN>/test/tasks.parquet, test/corpus.parquet  (test split: entities and numbers never seen in train)

$(RUNDIR)/tasks.parquet $(call corpus,$(RUNDIR)) &: pipelines/default.mk | build
	$(GENERATE) tasks --split train --seed $(SEED) \
	  $(call suite_flags,N) \
	  $(if $(call corpus,$(RUNDIR)),--corpus-out $(call corpus,$(RUNDIR))) -o $(RUNDIR)/tasks.parquet --stats $(RUNDIR)/stats/tasks.json

$(RUNDIR)/test/tasks.parquet $(call corpus,$(RUNDIR)/test) &: pipelines/default.mk | build
	$(GENERATE) tasks --split test --seed $(TEST_SEED) \
	  $(call suite_flags,TEST_N) \
	  $(if $(call corpus,$(RUNDIR)/test),--corpus-out $(call corpus,$(RUNDIR)/test)) -o $(RUNDIR)/test/tasks.parquet --stats $(RUNDIR)/stats/test_tasks.json

tasks: $(RUNDIR)/tasks.parquet $(RUNDIR)/test/tasks.parquet
